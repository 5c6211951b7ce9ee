"""The HLO collective parser (partitioning.plan.hlo): kinds, bytes, group sizes and while-loop trip counts."""

from partitioning.plan import hlo

HLO = """\
HloModule jit_step, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(%x, %y)
}

%slice_fusion (param_0: f32[64,32], param_1: s32[]) -> f32[8,32] {
  %param_0 = f32[64,32]{1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %c = s32[] constant(0)
  %conv = f32[64,32]{1,0} convert(%param_0)
  ROOT %ds = f32[8,32]{1,0} dynamic-slice(%conv, %param_1, %c), dynamic_slice_sizes={8,32}
}

%body (p: (s32[], f32[8,32])) -> (s32[], f32[8,32]) {
  %p = (s32[], f32[8,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %w = f32[8,32]{1,0} get-tuple-element(%p), index=1
  %ag = f32[64,32]{1,0} all-gather(%w), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %ar = (f32[64,32]{1,0}, f32[4]{0}) all-reduce(%ag, %ag), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %g0 = f32[64,32]{1,0} get-tuple-element(%ar), index=0
  %g1 = f32[4]{0} get-tuple-element(%ar), index=1
  %f = f32[8,32]{1,0} fusion(%g0, %i), kind=kLoop, calls=%slice_fusion
  ROOT %t = (s32[], f32[8,32]{1,0}) tuple(%i, %f)
}

%cond (p: (s32[], f32[8,32])) -> pred[] {
  %p = (s32[], f32[8,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[8,32]) -> f32[8,32] {
  %x = f32[8,32]{1,0} parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[8,32]{1,0}) tuple(%z, %x)
  %loop = (s32[], f32[8,32]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %cp = bf16[16,2]{1,0} collective-permute(%x), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %a2a = f32[8,32]{1,0} all-to-all(%x), channel_id=4, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}
  ROOT %out = f32[8,32]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_hlo_collectives_counts_bytes_and_trip_counts():
    ops = {(c.name, c.kind): c for c in hlo.collectives(HLO)}
    ag = ops[("ag", "all-gather")]
    assert (ag.bytes, ag.group_size, ag.executions) == (64 * 32 * 4, 8, 5)
    rs = ops[("ar", "reduce-scatter")]  # element 0 is only ever sliced
    assert (rs.hlo_op, rs.bytes, rs.shapes, rs.executions) == (
        "all-reduce+dynamic-slice",
        64 * 32 * 4,
        ("f32[64,32]",),
        5,
    )
    ar = ops[("ar", "all-reduce")]  # element 1 is used whole (here: unused)
    assert (ar.bytes, ar.group_size) == (16, 8)
    assert ops[("a2a", "all-to-all")].group_size == 4
    # A permute in which 2 of the 8 devices send: per device, on average, a quarter of the buffer.
    assert ops[("cp", "collective-permute")].bytes == 16 * 2 * 2 * 2 // 8
    s = hlo.summarize(hlo.collectives(HLO))
    assert s == {
        "all-gather": {"count": 5, "bytes": 5 * 8192},
        "reduce-scatter": {"count": 5, "bytes": 5 * 8192},
        "all-reduce": {"count": 5, "bytes": 5 * 16},
        "all-to-all": {"count": 1, "bytes": 1024},
        "collective-permute": {"count": 1, "bytes": 16},
    }
