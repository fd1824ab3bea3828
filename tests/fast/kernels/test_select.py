"""The kernel wrappers' shared host pieces (`fast.kernels.select`): TRITON_INTERPRET read as Triton reads it, and
the checked `kernels` attribute."""

import pytest

from specdec.fast.kernels import select

VALUES = ("1", "true", "TRUE", "On", "yes", "y", "Y", "0", "2", "01", "off", "no", "", " 1", "t")


def test_interpreting_agrees_with_triton_on_every_spelling(monkeypatch):
    """Where the wrappers and Triton disagree, a CPU tensor reaches a compiled kernel (or a CUDA tensor the
    interpreter): every spelling must read the same in both."""
    triton = pytest.importorskip("triton")
    if not hasattr(triton, "knobs"):
        pytest.skip(f"Triton {triton.__version__} has no knobs to compare with")
    for value in VALUES:
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert select.interpreting() == triton.knobs.runtime.interpret, repr(value)


def test_the_comparison_catches_the_old_rule(monkeypatch):
    """Negative control: the rule the wrappers used before (anything but "" and "0" is on) disagrees with Triton."""
    triton = pytest.importorskip("triton")
    if not hasattr(triton, "knobs"):
        pytest.skip(f"Triton {triton.__version__} has no knobs to compare with")
    old = []
    for value in VALUES:
        monkeypatch.setenv("TRITON_INTERPRET", value)
        if (value not in ("", "0")) != triton.knobs.runtime.interpret:
            old.append(value)
    assert "2" in old and "off" in old


def test_kernel_choice_checks_every_assignment():
    class Model:
        kernels = select.KernelChoice("the kernels")

    model = Model()
    model.kernels = "triton"
    assert model.kernels == "triton" and Model.kernels.__doc__ == "the kernels"
    with pytest.raises(ValueError, match="kernels must be 'auto', 'triton' or 'reference', got 'fast'"):
        model.kernels = "fast"
    assert model.kernels == "triton"  # (a refused value leaves the attribute as it was)
