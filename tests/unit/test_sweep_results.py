"""Merging sweep documents (torch sweep + MPI sweep) for one table and one plot; no ranks run."""
import io

import pytest

from shmcoll_bench import results as sweep_results


def _doc(labels, rows, memcpy=None):
    return {"machine": {"world_size": 2}, "config": {"backends": labels}, "memcpy_gbps": memcpy,
            "rows": [{"op": op, "dtype": dt, "bytes": n, "busbw_factor": 1.0,
                      "results": {lb: ({"status": "ok", "lat_us": lat, "algbw_gbps": n / lat / 1e3,
                                        "busbw_gbps": n / lat / 1e3} if lat else {"status": "n/a"})
                                  for lb, lat in zip(labels, lats)}}
                     for op, dt, n, lats in rows]}


TORCH = _doc(["shm", "gloo"], [("all_reduce", "float32", 8, (20.0, 700.0)),
                               ("all_reduce", "bfloat16", 8, (21.0, 800.0))], memcpy=6.8)
MPI = _doc(["mpi"], [("all_reduce", "float32", 8, (2.0,)), ("all_reduce", "bfloat16", 8, (None,)),
                     ("broadcast", "float32", 8, (5.0,))])


def test_rows_join_on_op_dtype_bytes_and_ratios_are_to_the_first_backend():
    merged = sweep_results.merge([MPI, TORCH])  # the document with the memcpy ceiling is the base
    assert merged["config"]["backends"] == ["shm", "gloo", "mpi"]
    assert merged["memcpy_gbps"] == 6.8
    f32 = next(r for r in merged["rows"] if r["dtype"] == "float32" and r["op"] == "all_reduce")
    assert f32["ratio"] == {"gloo/shm": 35.0, "mpi/shm": 0.1}
    bf16 = next(r for r in merged["rows"] if r["dtype"] == "bfloat16")
    assert bf16["ratio"]["mpi/shm"] is None and bf16["results"]["mpi"]["status"] == "n/a"
    only_mpi = next(r for r in merged["rows"] if r["op"] == "broadcast")
    assert only_mpi["ratio"] == {"gloo/shm": None, "mpi/shm": None}
    assert len(merged["sources"]) == 2
    assert TORCH["config"]["backends"] == ["shm", "gloo"]  # inputs are left alone


def test_the_same_backend_in_two_documents_is_an_error():
    with pytest.raises(ValueError, match="gloo"):
        sweep_results.merge([TORCH, _doc(["gloo"], [("all_reduce", "float32", 8, (1.0,))])])


def test_comparison_table_keeps_the_rows_mpi_has():
    out = io.StringIO()
    sweep_results.print_comparison(sweep_results.merge([TORCH, MPI]), out, only_with="mpi")
    lines = out.getvalue().splitlines()
    assert "mpi/shm x" in lines[0]
    assert len(lines) == 4  # header, rule, all_reduce float32, broadcast float32
