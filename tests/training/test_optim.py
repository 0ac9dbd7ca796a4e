import pytest
import torch

from grooves.training.optim import adamw


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in [(8, 16), (16, 8), (3,)]]


def test_fused_adamw_makes_the_same_updates_as_the_reference_implementation():
    fused_params, ref_params = _params(0), _params(0)
    fused = adamw(fused_params, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    ref = torch.optim.AdamW(ref_params, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1, foreach=False)
    assert fused.defaults["fused"] is True
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=g) for p in fused_params]
        for ps, opt in ((fused_params, fused), (ref_params, ref)):
            for p, grad in zip(ps, grads, strict=True):
                p.grad = grad.clone()
            opt.step()
    for a, b, start in zip(fused_params, ref_params, _params(0), strict=True):
        assert not torch.equal(a, start)  # the parameters moved
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_complex_parameters_fall_back_to_the_default_implementation():
    complex_params = [torch.nn.Parameter(torch.ones(3, dtype=torch.complex64))]
    opt = adamw(complex_params, lr=0.1, betas=(0.9, 0.99), weight_decay=0.0)
    assert not opt.defaults["fused"]  # torch's fused kernel takes floating-point tensors only
    complex_params[0].grad = torch.ones(3, dtype=torch.complex64)
    opt.step()
    assert complex_params[0].real.lt(1).all()


def test_no_trainable_parameters_is_a_clear_error():
    with pytest.raises(ValueError, match="no trainable parameters"):
        adamw([], lr=0.1, betas=(0.9, 0.99), weight_decay=0.0)


# ---- the learning-rate schedule ------------------------------------------------------------------
from grooves.config import ConfigError, OptimConfig, parse_config, parse_sft_config  # noqa: E402
from grooves.training.optim import lr_factor, lr_scheduler  # noqa: E402


@pytest.mark.parametrize(
    "schedule,expected",
    [
        # warmup 2 of 6 steps: 1/3, 2/3; then p = 0, 1/4, 2/4, 3/4 of the way to min 0.1
        ("constant", [1 / 3, 2 / 3, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [1 / 3, 2 / 3, 1.0, 0.775, 0.55, 0.325]),
        ("cosine", [1 / 3, 2 / 3, 1.0, 0.1 + 0.9 * (1 + 2**-0.5) / 2, 0.55, 0.1 + 0.9 * (1 - 2**-0.5) / 2]),
    ],
)
def test_lr_factor_is_the_documented_formula(schedule, expected):
    got = [lr_factor(d, schedule=schedule, warmup_steps=2, total_steps=6, min_ratio=0.1) for d in range(6)]
    assert got == pytest.approx(expected, rel=1e-12)


def _rates(config, total, steps):
    params = _params(0)
    opt = adamw(params, lr=config.lr, betas=(0.9, 0.99), weight_decay=0.0)
    sched = lr_scheduler(opt, config, total)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        sched.step()
    return rates, opt


def test_a_scheduler_started_at_a_step_continues_as_one_that_ran_there():
    opt = OptimConfig(lr=0.02, lr_schedule="cosine", warmup_steps=2, min_lr_ratio=0.1)
    whole, _ = _rates(opt, 8, 8)
    assert whole == pytest.approx(
        [
            0.02 * lr_factor(d, schedule="cosine", warmup_steps=2, total_steps=8, min_ratio=0.1)
            for d in range(8)
        ],
        rel=1e-12,
    )
    first, optimizer = _rates(opt, 8, 3)
    # as after loading a checkpoint: the optimizer's saved state carries the rate it last used
    params = _params(1)
    resumed = adamw(params, lr=opt.lr, betas=(0.9, 0.99), weight_decay=0.0)
    resumed.load_state_dict(optimizer.state_dict())
    sched = lr_scheduler(resumed, opt, 8, done=3)
    rest = []
    for _ in range(5):
        rest.append(resumed.param_groups[0]["lr"])
        for p in params:
            p.grad = torch.ones_like(p)
        resumed.step()
        sched.step()
    assert first + rest == whole  # exactly


def test_warmup_as_long_as_the_run_is_refused_in_one_line():
    with pytest.raises(ConfigError) as exc:
        parse_config({"steps": 4, "optim": {"warmup_steps": 4}})
    assert str(exc.value) == (
        "optim.warmup_steps (4) must be below steps (4): the run would end before the learning rate reaches optim.lr"
    )
    with pytest.raises(ConfigError, match=r"optim.warmup_steps \(5\) must be below steps \(2\)"):
        parse_sft_config({"data": "x.jsonl", "steps": 2, "optim": {"warmup_steps": 5}})
    with pytest.raises(
        ConfigError, match="optim.lr_schedule: Input should be 'constant', 'linear' or 'cosine'"
    ):
        parse_config({"optim": {"lr_schedule": "step"}})
