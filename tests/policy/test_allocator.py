"""The allocator setting leaves C libraries other than glibc alone (benchmarks/bench_allocator.py
measures what it saves on glibc)."""


def test_other_c_libraries_are_left_alone(monkeypatch):
    from grooves.policy.fast import allocator

    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    assert allocator.reuse_freed_memory() is False
