"""Baselines behave as the systems they stand for, under the same simulator and workloads."""

from evaluation.baselines import Kubernetes, Serverless, serverless_executors
from evaluation.closedloop import Policy, run
from evaluation.experiments.common import search_baseline, static_gpu, static_policy, tangram
from evaluation.workloads import get_workload
from solvers import get_allocator


def test_baselines_registered():
    for name in ("k8s", "static", "serverless", "api-retry", "fixed-dop", "by-resource"):
        get_allocator(name) if name != "fixed-dop" else get_allocator(name, dop=4)


def test_k8s_actions_stay_on_their_pod_and_pods_queue():
    w = get_workload("coding", batch=12, nodes=1, cores_per_node=16, turns_mean=4)
    k = Kubernetes(pod_cores=4)
    seen: dict[str, set] = {}
    orig = k.allocate

    def spy(view, queue, now):
        out = orig(view, queue, now)
        for a in out:
            node, cores = k.pods[a.action.trajectory]
            assert set(a.placement["cpu"].cores) <= set(cores)
            assert a.units["cpu"] <= 4
            seen.setdefault(a.action.trajectory, set()).add(node)
        return out

    k.allocate = spy  # type: ignore[method-assign]
    r = run(w, Policy("k8s", k, k))
    assert len(r.records) == w.num_actions
    # 16 cores hold 4 pods: some of the 12 trajectories waited for a pod
    assert max(b - a for a, b in r.setups.values()) > 5.0


def test_tangram_beats_kubernetes_when_pods_are_scarce():
    w = get_workload("coding", batch=32, nodes=1, cores_per_node=32, turns_mean=6)
    k = Kubernetes(pod_cores=4)
    ours, base = run(w, tangram()), run(w, Policy("k8s", k, k))
    assert ours.per_trajectory() + ours.mean_setup() < base.per_trajectory() + base.mean_setup()


def test_api_retry_gets_429s_and_tangram_none():
    w = get_workload("deepsearch", batch=64, search_qps=1.0, browse_qps=1.0)
    pol = search_baseline(w, static_gpu(["judge"], w, 1, replicas=5))
    r = run(w, pol)
    api = pol.allocator.routes[0][1]
    assert api.rejections > 0
    assert len(r.records) == w.num_actions
    ours = run(w, tangram())
    assert ours.mean_act("search") < r.mean_act("search")


def test_static_never_restores_and_uses_only_its_pins():
    w = get_workload("mopd", batch=32, gpu_nodes=5)
    pol = static_policy("static", static_gpu(sorted(w.gpu.services), w, 4))
    r = run(w, pol)
    assert r.counters["restores"] == 0
    assert all(rec.units["gpu"] == 4 for rec in r.records.values())


def test_serverless_loads_slower_than_tangram_restores():
    w = get_workload("mopd", batch=64, gpu_nodes=2)
    r = run(w, Policy("sls", Serverless(dop=4), executors=serverless_executors()))
    assert r.counters["restores"] > 0
    assert all(rec.units["gpu"] == 4 for rec in r.records.values())


def test_fixed_dop_grants_exactly_its_dop():
    w = get_workload("coding", batch=4, turns_mean=3)
    r = run(w, Policy("d", get_allocator("fixed-dop", dop=16)))
    for aid, rec in r.records.items():
        assert rec.units["cpu"] == (16 if aid.endswith("reward") else 1)
