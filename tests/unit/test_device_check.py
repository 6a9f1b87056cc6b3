"""The device check without a GPU: it finds every GPU test, reads a pytest run's passes, skips
(with their reasons) and failures, and on a machine without CUDA says so and checks nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from evaluation import device_check
from evaluation.device_check import ROOT, gpu_test_files, run_gpu_tests


def test_every_test_file_that_needs_torch_or_names_cuda_is_a_gpu_test():
    found = {str(p.relative_to(ROOT)) for p in gpu_test_files()}
    assert {
        "tests/unit/test_gpu_torch.py",
        "tests/integration/test_gpu_production_path.py",
    } <= found
    for p in (ROOT / "tests").rglob("test_*.py"):
        if "torch.cuda" in p.read_text() and p != Path(__file__):  # this one patches CUDA away
            assert str(p.relative_to(ROOT)) in found, f"{p} names CUDA but is no GPU test"
    assert "tests/unit/test_registry.py" not in found  # torch only for one builtin's lookup


def test_a_run_counts_passes_skips_with_reasons_and_failures(tmp_path: Path):
    f = tmp_path / "test_some_gpu.py"
    f.write_text(
        textwrap.dedent("""
            import pytest

            def test_fits():
                pass

            def test_two():
                pytest.skip("needs 2 CUDA devices, this machine has 1")

            def test_broken():
                assert 1 == 2, "one is not two"
        """)
    )
    t = run_gpu_tests([f], cwd=tmp_path, timeout_s=120)
    assert (t["passed"], t["skipped"], t["failed"], t["errors"], t["ok"]) == (1, 1, 1, 0, False)
    assert t["skips"] == [("test_some_gpu::test_two", "needs 2 CUDA devices, this machine has 1")]
    [(test, why)] = t["failures"]
    assert test == "test_some_gpu::test_broken" and "one is not two" in why


def test_without_cuda_it_says_there_is_none_and_checks_nothing(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ran = []
    monkeypatch.setattr(device_check, "run_gpu_tests", lambda *a, **k: ran.append(a))
    assert device_check.main([]) == 2
    err = capsys.readouterr().err
    assert "this machine has no CUDA device" in err and "Nothing was checked" in err
    assert "Traceback" not in err and not ran
