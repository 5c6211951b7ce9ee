"""Per mesh axis (partitioning.plan.axes): replica groups and permute pairs -> mesh axes; what each axis splits."""

import pytest

from partitioning.plan.axes import collectives_by_axis, device_groups, group_axes, memory_by_axis
from partitioning.plan.hlo import Collective

MESH = {"stage": 4, "data": 2}


@pytest.mark.parametrize(
    "text,groups",
    [
        ("{{0,1},{2,3}}", [[0, 1], [2, 3]]),
        ("{}", [list(range(8))]),
        ("[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("[4,2]<=[2,4]T(1,0)", [[0, 4], [1, 5], [2, 6], [3, 7]]),
        ("mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", [[0, 2, 4, 6]]),
        ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}", [[0, 1]]),
        ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_2'}", [[0, 2, 4, 6]]),
    ],
)
def test_device_groups_of_every_replica_group_form(text, groups):
    assert device_groups(text, 8) == groups


@pytest.mark.parametrize(
    "text,permute,axes",
    [
        ("[4,2]<=[8]", False, ("data",)),  # devices 2i, 2i+1: neighbours along `data`
        ("[2,4]<=[4,2]T(1,0)", False, ("stage",)),  # 0, 2, 4, 6
        ("{}", False, ("stage", "data")),
        ("{{0,2},{1,3},{2,4},{3,5},{4,6},{5,7},{6,0},{7,1}}", True, ("stage",)),  # the pipeline's shift
        ("{{0,6},{1,7}}", True, ("stage",)),
        ("{{0,1},{1,0}}", True, ("data",)),
    ],
)
def test_group_axes(text, permute, axes):
    assert group_axes(text, MESH, permute=permute) == axes


def test_collectives_by_axis_sums_bytes_and_executions_per_axis():
    ops = [
        Collective(
            "collective-permute",
            "collective-permute",
            "cp",
            "body",
            ("f32[4]",),
            16,
            None,
            7,
            "",
            groups="{{0,2},{2,4},{4,6},{6,0}}",
        ),
        Collective("all-reduce", "all-reduce", "ar", "main", ("f32[8]",), 32, 2, 1, "", groups="[4,2]<=[8]"),
        Collective("all-reduce", "all-reduce", "ar2", "main", ("f32[8]",), 32, 8, 2, "", groups="{}"),
    ]
    out = collectives_by_axis(ops, MESH)
    assert out["stage"]["collective-permute"] == {"count": 7, "bytes": 112}
    assert out["data"]["all-reduce"] == {"count": 1, "bytes": 32}
    assert out["stage+data"]["all-reduce"] == {"count": 2, "bytes": 64}
    # The JSON form (to_json() + groups) works too.
    assert collectives_by_axis([ops[0].to_json() | {"groups": ops[0].groups}], MESH) == {"stage": out["stage"]}


def test_memory_by_axis(make_gpt, make_plan):
    plan = make_plan(make_gpt(), {"stage": 2, "data": 1, "fsdp": 4}, "pp_fsdp")
    axes = memory_by_axis(plan.params + plan.opt_state, plan.mesh)
    assert axes["stage"]["splits"] == ["layers"]
    assert axes["fsdp"]["splits"] == ["embed"]  # every GPT param has an embed dim
    assert axes["data"] == {"size": 1, "splits": [], "per_device_bytes": 0, "unsplit_bytes": 0}
    stacked = [leaf for leaf in plan.params + plan.opt_state if leaf.names and "layers" in leaf.names]
    assert axes["stage"]["per_device_bytes"] == sum(leaf.per_device_bytes for leaf in stacked)
    assert axes["stage"]["unsplit_bytes"] == 2 * axes["stage"]["per_device_bytes"]
    assert plan.to_json()["axes"] == axes
