"""Services, variants and the registry: validation names the field and the value."""

from __future__ import annotations

import pytest

from managers.gpu import GB, RestoreModel, Service, ServiceRegistry
from tangram.errors import ValidationError


def test_sharded_splits_weights_per_gpu_plus_reserve() -> None:
    s = Service.sharded("judge", 64 * GB, dops=(1, 2, 4), reserve_bytes=GB)
    assert [s.bytes_per_gpu(k) for k in s.dops] == [65 * GB, 33 * GB, 17 * GB]


def test_unknown_variant_and_bad_dop_are_named() -> None:
    s = Service.uniform("a", GB, dops=(1, 2))
    with pytest.raises(ValidationError, match=r"services\.a\.dop.*got 4"):
        s.bytes_per_gpu(4)
    with pytest.raises(ValidationError, match=r"services\.b\.dop"):
        Service.uniform("b", GB, dops=(3,))
    with pytest.raises(ValidationError, match="memory_bytes"):
        Service("c", {1: 0})


def test_registry_refuses_duplicates_and_names_unknown() -> None:
    reg = ServiceRegistry({"a": Service.uniform("a", GB)})
    with pytest.raises(ValidationError, match="already registered"):
        reg.register(Service.uniform("a", GB))
    with pytest.raises(ValidationError, match=r"registered: \['a'\]"):
        reg.get("b")
    assert "a" in reg and len(reg) == 1 and reg.names() == ["a"]


def test_restore_model() -> None:
    assert RestoreModel(50.0, 0.2).seconds(50 * GB) == pytest.approx(1.2)
    with pytest.raises(ValidationError, match="bandwidth"):
        RestoreModel(0.0)
    s = Service.uniform("a", 10 * GB, restore_s=3.0)
    assert s.restore_seconds(1, RestoreModel()) == 3.0
