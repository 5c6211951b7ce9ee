"""A verified restore reads each stored byte once, on any layout (partitioning.checkpoint.reader):
onto another layout it reads the stored slices, checksums them and cuts the new slices from them,
instead of reading the new slices and then the stored ones again for their checksums."""

import tensorstore as ts

import partitioning as pt


def file_bytes_read() -> int:
    """Bytes tensorstore has read from local files in this process (its own counter)."""
    for m in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/file/bytes_read"):
        return int(m["values"][0]["value"])
    return 0


def test_a_resharding_restore_reads_the_stored_bytes_once_and_restores_them_exactly(saved, mesh_of, assert_bit_exact):
    s, root = saved
    before = file_bytes_read()
    want = pt.restore_checkpoint(root, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))  # slices as stored
    once = file_bytes_read() - before
    target = s.target(mesh_of({"data": 1, "fsdp": 2, "tensor": 4}), "fsdp_tp")  # cuts across every stored slice
    before = file_bytes_read()
    got = pt.restore_checkpoint(root, target)
    assert once > 0 and file_bytes_read() - before == once  # was 30x: each new slice read, then the stored ones
    assert_bit_exact(got, want)
    assert got.params["blocks"]["attn"]["q"].sharding.spec == target.params["blocks"]["attn"]["q"].sharding.spec
