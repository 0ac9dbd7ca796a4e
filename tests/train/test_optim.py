import pytest
import torch

from grooves.train.optim import adamw


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
