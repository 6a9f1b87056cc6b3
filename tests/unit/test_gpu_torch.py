"""The torch backend: restore really copies the weights to the device, evict really frees them,
invoke runs the forward pass on the device copy. Runs on CPU (a separate copy stands for the
device) and, where CUDA is available, checks the CUDA memory counters too."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

from managers.gpu import GB, GpuManager, Residency, ServiceRegistry, create_backend
from managers.gpu.tinylm import DTYPE_BYTES, TinyLM, TinyLMConfig
from managers.gpu.torch_backend import TorchBackend, missing_devices, torch_service
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import ChunkPool, Placement
from topology import ChunkTree

CFG = TinyLMConfig(vocab=64, dim=32, layers=2, heads=4, max_len=32, seed=3)
REQ = {"tokens": [[1, 5, 9, 2], [7, 7, 3]]}


def backend() -> TorchBackend:
    b = create_backend(
        "torch",
        models={"lm": CFG, "lm2": TinyLMConfig(vocab=64, dim=32, layers=1, seed=4)},
        cpu_stand_in=True,
    )  # CUDA where there is one, else the CPU stands in
    assert isinstance(b, TorchBackend)
    return b


def test_restore_copies_every_tensor_and_evict_frees_them() -> None:
    """A 2-GPU chunk where the machine has 2 CUDA devices or none (the CPU stands in); on a
    1-GPU machine the chunk is that GPU (one replica)."""
    b, s = backend(), torch_service("lm", CFG, dops=(1, 2))
    k = min(2, torch.cuda.device_count()) if b.cuda else 2
    chunk = (0, k)
    gpus = range(k) if b.cuda else range(0)

    async def go():
        await b.deploy(s)
        assert b.device_bytes() == 0
        before = {g: torch.cuda.memory_allocated(g) for g in gpus}
        await b.restore(s, "n", chunk)
        replicas = b.device[("lm", "n", chunk)]
        assert len(replicas) == k and b.device_bytes() == k * CFG.nbytes()
        host = b.host["lm"]
        refs = []
        for rep in replicas:
            assert rep.keys() == host.keys()
            for name, t in rep.items():
                assert t.data_ptr() != host[name].data_ptr()  # a copy, not a view
                assert torch.equal(t.cpu(), host[name])
                refs.append(weakref.ref(t))
        if b.cuda:
            assert [next(iter(r.values())).device.index for r in replicas] == list(gpus)
            for g in gpus:  # one full replica on each GPU of the chunk
                assert torch.cuda.memory_allocated(g) - before[g] >= CFG.nbytes()
        del replicas, rep, t
        await b.evict(s, "n", chunk)
        gc.collect()
        assert b.device_bytes() == 0 and all(r() is None for r in refs)
        assert {g: torch.cuda.memory_allocated(g) for g in gpus} == before
        assert b.host["lm"] is host  # the host copy is kept

    asyncio.run(go())


@pytest.mark.parametrize(
    ("have", "chunk", "said"),
    [
        (1, (0, 2), "a 2-GPU chunk needs GPUs 0-1; this machine has GPU 0 only"),
        (0, (0, 1), "a 1-GPU chunk needs GPU 0; this machine has no CUDA device"),
        (2, (2, 4), "a 2-GPU chunk needs GPUs 2-3; this machine has GPUs 0-1 only"),
    ],
)
def test_a_chunk_beyond_the_cuda_devices_names_its_gpus_and_those_present(
    monkeypatch, have, chunk, said
) -> None:
    """No GPU needed: CUDA's availability and device count are what the backend asks torch."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: have)
    b = TorchBackend({"lm": CFG})
    assert b.cuda
    with pytest.raises(ValidationError) as e:
        b.devices_of(chunk)
    assert e.value.field == "gpu.chunk" and e.value.value == chunk
    assert e.value.problem == said == missing_devices(chunk, have)
    assert str(e.value) == f"gpu.chunk: {said} (got {chunk!r})"
    with pytest.raises(ValidationError, match="needs GPU 5; this machine"):
        b.device_of(5)
    if have:
        assert b.devices_of((0, have))[-1] == torch.device("cuda", have - 1)


def test_invoke_returns_the_models_log_probs_and_needs_residency() -> None:
    b, s = backend(), torch_service("lm", CFG)

    async def go():
        await b.deploy(s)
        with pytest.raises(RuntimeError, match="not resident"):
            await b.invoke(s, "n", (0, 1), REQ)
        await b.restore(s, "n", (0, 1))
        return await b.invoke(s, "n", (0, 1), REQ)

    out = asyncio.run(go())
    want = TinyLM(CFG)(torch.tensor([REQ["tokens"][0]]))[0].tolist()
    assert out["logprobs"][0] == pytest.approx(want, abs=1e-5)
    assert [len(x) for x in out["logprobs"]] == [3, 2]
    assert all(v < 0 for v in out["logprobs"][1])


def test_manager_on_torch_keeps_device_memory_to_the_residency_cache() -> None:
    cfg2 = TinyLMConfig(vocab=64, dim=32, layers=1, seed=4)
    reg = ServiceRegistry({"lm": torch_service("lm", CFG), "lm2": torch_service("lm2", cfg2)})
    gpu = CFG.nbytes() + cfg2.nbytes() - 1  # the two never fit one GPU together
    res = Residency.uniform({"n": 1}, gpu, reg)
    b = backend()
    m = GpuManager(ChunkPool("gpu", {"n": ChunkTree(1, "n")}), res, b)

    async def go():
        outs = []
        for i, name in enumerate(["lm", "lm", "lm2", "lm"]):
            a = Action(f"x{i}", {"gpu": 1}, duration=1.0, service=name, payload=REQ)
            placement = {"gpu": Placement("n", chunk=(0, 1))}
            outs.append(await m.run(Assignment(a, {"gpu": 1}, placement)))
            assert b.device_bytes() == res.used_bytes("n", 0) <= gpu
        await m.close()
        return outs

    outs = asyncio.run(go())
    assert [o.status for o in outs] == ["ok"] * 4
    assert [o.detail for o in outs] == ["restored", "resident", "restored", "restored"]
    assert outs[0].output == outs[1].output


def test_bad_request_is_an_error_outcome_naming_the_field() -> None:
    reg = ServiceRegistry({"lm": torch_service("lm", CFG)})
    m = GpuManager(
        ChunkPool("gpu", {"n": ChunkTree(1, "n")}), Residency.uniform({"n": 1}, GB, reg), backend()
    )
    a = Action("x", {"gpu": 1}, duration=1.0, service="lm", payload={"tokens": [[1]]})
    out = asyncio.run(m.run(Assignment(a, {"gpu": 1}, {"gpu": Placement("n", chunk=(0, 1))})))
    assert out.status == "error" and "payload.tokens" in out.detail


@pytest.mark.parametrize("dtype", sorted(DTYPE_BYTES))
def test_the_dtype_table_agrees_with_torch(dtype):
    """A config's size needs no torch; its table says what torch's element size says."""
    assert DTYPE_BYTES[dtype] == torch.empty((), dtype=getattr(torch, dtype)).element_size()
    cfg = TinyLMConfig(vocab=64, dim=32, layers=1, dtype=dtype)
    assert cfg.nbytes() == sum(p.numel() for p in TinyLM(cfg).parameters()) * DTYPE_BYTES[dtype]
