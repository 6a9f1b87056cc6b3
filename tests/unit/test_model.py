import math

import pytest

from tangram import Action, Demand, Elasticity, Infeasible, TangramError, ValidationError


def test_demand_constructors():
    assert Demand.fixed(3).amounts == (3,)
    assert Demand.range(2, 4).amounts == (2, 3, 4)
    assert Demand.choices([8, 1, 4, 2]).amounts == (1, 2, 4, 8)
    assert Demand.parse({"min": 1, "max": 2}).amounts == (1, 2)
    assert Demand.parse([1, 2]).amounts == (1, 2)
    assert Demand.parse(5).min == 5
    assert Demand.choices([1, 2, 4]).allows(2) and not Demand.choices([1, 2, 4]).allows(3)


@pytest.mark.parametrize("bad", [0, -1, 1.5, math.nan, "2", True, [], [1, 1], {"min": 3, "max": 1}])
def test_demand_rejects_bad_values_naming_them(bad):
    with pytest.raises(ValidationError) as exc:
        Demand.parse(bad, "demand.cpu")
    assert "demand.cpu" in str(exc.value)


def test_elasticity_duration():
    el = Elasticity("cpu", 8.0, {1: 1.0, 2: 0.5, 4: 0.25})
    assert el.duration(1) == 8.0 and el.duration(2) == 8.0 and el.duration(4) == 8.0
    f = Elasticity("cpu", 12.0, lambda m: 1.0)
    assert f.duration(4) == 3.0


@pytest.mark.parametrize("e", [0.0, 1.01, -0.5, math.nan, math.inf])
def test_efficiency_out_of_range(e):
    with pytest.raises(ValidationError) as exc:
        Elasticity("cpu", 1.0, {1: e})
    assert "efficiency[1]" in str(exc.value)


@pytest.mark.parametrize("t", [0, -1, math.nan, math.inf])
def test_t_ori_must_be_positive_finite(t):
    with pytest.raises(ValidationError, match="t_ori"):
        Elasticity("cpu", t, {1: 1.0})


def test_action_validation():
    el = Elasticity("cpu", 4.0, {1: 1.0, 2: 1.0})
    a = Action("a", {"cpu": [1, 2]}, elasticity=el)
    assert a.is_elastic and a.mins["cpu"] == 1 and a.duration_at(2) == 2.0
    with pytest.raises(ValidationError, match="demands"):
        Action("a", {})
    with pytest.raises(ValidationError, match="elasticity.key"):
        Action("a", {"gpu": 1}, elasticity=el)
    with pytest.raises(ValidationError, match="efficiency"):
        Action("a", {"cpu": [1, 2, 4]}, elasticity=el)  # no E(4)
    with pytest.raises(ValidationError, match="duration"):
        Action("a", {"cpu": 1}, duration=math.nan)
    with pytest.raises(ValidationError, match=r"demands\.cpu"):
        Action("a", {"cpu": -2})
    bad_fn = Elasticity("cpu", 4.0, lambda m: 2.0)
    with pytest.raises(ValidationError, match="efficiency"):
        Action("a", {"cpu": [1, 2]}, elasticity=bad_fn)


def test_error_hierarchy():
    assert issubclass(Infeasible, TangramError)
    assert issubclass(ValidationError, TangramError)
