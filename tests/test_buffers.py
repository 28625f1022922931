"""Buffers (:mod:`blockprep.buffers` and every writer over them): ids that alias the
destination, self-overlapping or shared buffers, one owner per byte, adopted buffers that overlap,
read-only memory, and the device mirror's copies racing the next step's host writes."""

from __future__ import annotations

import gc
import itertools
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import blockprep.adapters.qwen as qwen_module
from blockprep import BlockprepError, BlockTable, DecodeBatch, paged_block_table, ring_block_table
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.buffers import (
    DeviceMirror,
    MirrorFence,
    check_writable,
    has_self_overlap,
    host_tensor,
    mapped_writable,
    release_buffers,
)
from blockprep.grouped import GroupedTables, TableGroup
from blockprep.reference import block_table_per_row, ring_block_table_repeat
from blockprep.slots import paged_slot_mapping

ROOT = Path(__file__).resolve().parent.parent

# --- 1. ids that alias the destination -----------------------------------------------------------


def test_ring_builder_reads_ids_that_alias_out_before_overwriting_them() -> None:
    out = torch.zeros(2, 5, dtype=torch.int32)
    out.view(-1)[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    ring_block_table(out.view(-1)[:4].view(2, 2), 5, out=out)
    assert out.tolist() == [[1, 2, 1, 2, 1], [3, 4, 3, 4, 3]]
    # One row (the lone-row path) and the NumPy destination.
    array = np.zeros((1, 7), dtype=np.int32)
    array[0, :3] = [5, 6, 7]
    ring_block_table(array[:, 1:3], 7, out=array)
    assert array.tolist() == [[6, 7, 6, 7, 6, 7, 6]]


def test_paged_builder_reads_ids_that_alias_out_before_overwriting_them() -> None:
    out = torch.zeros(2, 5, dtype=torch.int32)
    out.view(-1)[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    paged_block_table(out.view(-1)[:4].view(2, 2), 5, pad=-1, out=out)
    assert out.tolist() == [[1, 2, -1, -1, -1], [3, 4, -1, -1, -1]]


def test_block_table_row_written_from_its_own_buffer() -> None:
    table = BlockTable(1, 7, kind="ring")
    table.write_row(0, [1, 2, 3])
    table.write_row(0, table.tensor[0, 1:3])
    assert table.tensor.tolist() == [[2, 3, 2, 3, 2, 3, 2]]
    assert table.cached_ids(0) == [2, 3]
    table.check()


def test_block_table_rows_written_from_another_row_of_the_same_step() -> None:
    """Row 1's ids are a view of row 0, which the same all-or-nothing step rewrites first: the
    ids are the ones given (read when the step is planned), buffer and cache agree."""
    for kind in ("ring", "paged"):
        table = BlockTable(2, 6, kind=kind)  # type: ignore[arg-type]
        table.write_rows([[1, 2, 3], [4, 5, 6]])
        table.write_rows([[7, 8], table.tensor[0, :2]])
        rows = [[7, 8], [1, 2]]
        expected = (
            ring_block_table_repeat(rows, max_blocks=6)
            if kind == "ring"
            else block_table_per_row(rows, max_blocks=6, pad=-1)
        )
        assert table.tensor.tolist() == expected.tolist(), kind
        assert [table.cached_ids(0), table.cached_ids(1)] == rows
        table.check()


# --- 2. self-overlapping and shared destinations -------------------------------------------------


def _overlapping_outs() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(name, out, base)``: a destination ``[2, 5]`` whose cells share memory, and its base."""
    expanded_base = torch.full((1, 5), 9, dtype=torch.int32)
    strided_base = torch.full((8,), 9, dtype=torch.int32)
    return [
        ("expand", expanded_base.expand(2, 5), expanded_base),
        ("as_strided rows overlap", strided_base.as_strided((2, 5), (3, 1)), strided_base),
        ("zero column stride", strided_base.as_strided((2, 5), (5, 0)), strided_base),
    ]


@pytest.mark.parametrize("builder", ["ring", "paged"])
def test_self_overlapping_out_is_rejected_before_writing(builder: str) -> None:
    for name, out, base in _overlapping_outs():
        before = base.clone()
        with pytest.raises(ValueError, match="out overlaps itself"):
            if builder == "ring":
                ring_block_table([[1, 2], [3]], 5, out=out)
            else:
                paged_block_table([[1, 2], [3]], 5, out=out)
        assert torch.equal(base, before), name
        array = base.numpy()
        view = np.lib.stride_tricks.as_strided(array, tuple(out.shape), tuple(out.numpy().strides))
        with pytest.raises(ValueError, match="out overlaps itself"):
            ring_block_table([[1, 2], [3]], 5, out=view)
        assert torch.equal(base, before), name


def test_non_contiguous_outs_that_do_not_overlap_are_accepted() -> None:
    rows = [[1, 2, 3], [4]]
    transposed = torch.zeros(5, 2, dtype=torch.int32).t()  # strides (1, 2)
    interleaved = torch.zeros(10, dtype=torch.int32).as_strided((2, 5), (1, 2))
    for out in (transposed, interleaved):
        assert ring_block_table(rows, 5, out=out).tolist() == (
            ring_block_table_repeat(rows, max_blocks=5).tolist()
        )
        assert paged_block_table(rows, 5, out=out).tolist() == (
            block_table_per_row(rows, max_blocks=5).tolist()
        )


def test_slot_mapping_rejects_a_self_overlapping_out() -> None:
    base = torch.full((1,), 7, dtype=torch.int32)
    with pytest.raises(ValueError, match="out overlaps itself"):
        paged_slot_mapping([[1], [2], [3]], [1, 1, 1], 4, out=base.expand(3))
    assert base.tolist() == [7]
    spread = torch.zeros(6, dtype=torch.int32)
    paged_slot_mapping([[1], [2], [3]], [1, 2, 3], 4, out=spread[::2])
    assert spread.tolist() == [4, 0, 9, 0, 14, 0]


def test_has_self_overlap_agrees_with_every_offset() -> None:
    """The one-pass test and its exact fallback against a brute-force count of byte offsets."""
    base = np.zeros(64, dtype=np.int32)
    for shape in itertools.product((1, 2, 3), repeat=2):
        for strides in itertools.product((0, 1, 2, 3, 4, 6), repeat=2):
            view = np.lib.stride_tricks.as_strided(
                base, shape, tuple(4 * s for s in strides), writeable=False
            )
            offsets = [
                sum(i * s for i, s in zip(index, view.strides, strict=True))
                for index in itertools.product(*map(range, shape))
            ]
            assert has_self_overlap(view) == (len(set(offsets)) < len(offsets)), (shape, strides)
    # Items wider than the stride overlap partly: int32 cells 2 bytes apart.
    partial = np.lib.stride_tricks.as_strided(base, (3,), (2,), writeable=False)
    assert has_self_overlap(partial)


def test_two_block_tables_cannot_share_a_buffer() -> None:
    owner = BlockTable(2, 4)
    with pytest.raises(ValueError, match="overlaps the buffer of another live BlockTable"):
        BlockTable(2, 4, buffer=owner.tensor)
    flat = torch.zeros(16, dtype=torch.int32)
    first = BlockTable(2, 4, buffer=flat[:8])
    with pytest.raises(ValueError, match="overlaps the buffer of another live BlockTable"):
        BlockTable(2, 4, buffer=flat[4:12])
    second = BlockTable(2, 4, buffer=flat[8:])  # adjacent, not overlapping
    second.write_row(0, [1])
    first.write_row(1, [2])
    assert flat.tolist()[:9] == [0, 0, 0, 0, 2, -1, -1, -1, 1]  # adopted rows: as they were
    # A table's claim ends with the table, even one kept alive only by a reference cycle.
    del first
    third = BlockTable(2, 4, buffer=flat[:8])
    third.cycle = third  # type: ignore[attr-defined]
    del third
    BlockTable(2, 4, buffer=flat[:8])
    gc.collect()


# --- 3. read-only memory -------------------------------------------------------------------------

READ_ONLY_SCRIPT = textwrap.dedent(
    """
    import mmap, sys, tempfile, warnings
    import numpy as np, torch
    import blockprep
    from blockprep.adapters.qwen import QwenDecodePreparer
    from blockprep.grouped import GroupedTables, TableGroup
    from blockprep.slots import paged_slot_mapping
    warnings.simplefilter("ignore")  # torch warns that a read-only array gives a tensor
    f = tempfile.TemporaryFile()
    f.write(bytes(1 << 16))
    f.flush()
    memory = mmap.mmap(f.fileno(), 1 << 16, access=mmap.ACCESS_READ)
    ro = torch.from_numpy(np.frombuffer(memory, dtype=np.int32))

    def grouped():  # on 9ea27c1 a SIGSEGV at the first commit
        groups = [TableGroup("x", "ring", 4, id_limit=100)]
        counts = torch.zeros(3, 1, dtype=torch.int32)
        g = GroupedTables(groups, 3, buffers=[({"x": ro[:12].view(3, 4)}, counts)])
        g.commit(g.plan([[[1, 2]], [[3]], [[4]]], ["a", "b", "c"]), 0)

    def qwen():
        buffers = {"seq_lens": torch.zeros(2, dtype=torch.int32), "slot_mapping": ro[:2]}
        QwenDecodePreparer(2, 16, 4, buffers=buffers)

    cases = {
        "ring": lambda: blockprep.ring_block_table([[1, 2]], 8, out=ro[:16].view(2, 8)[:1]),
        "paged": lambda: blockprep.paged_block_table([[1, 2]], 8, out=ro[:8].view(1, 8)),
        "slots": lambda: paged_slot_mapping([[1]], [1], 4, out=ro[:4]),
        "block_table": lambda: blockprep.BlockTable(2, 8, buffer=ro[:16]),
        "tokens": lambda: blockprep.PaddedTokenBuffer(2, 8, buffer=ro[:16].view(2, 8)),
        "bytes array": lambda: blockprep.ring_block_table(
            [[1]], 4, out=np.frombuffer(bytes(16), dtype=np.int32).reshape(1, 4)
        ),
        "grouped": grouped,
        "qwen": qwen,
    }
    for name, case in cases.items():
        try:
            case()
        except ValueError as error:
            print(name, "->", error, flush=True)
        else:
            print(name, "-> accepted", flush=True)
    print("alive")
    """
)


def test_read_only_memory_is_a_clean_error_not_a_crash() -> None:
    """Run in a subprocess: on code without the check, the first case is a SIGSEGV."""
    done = subprocess.run(
        [sys.executable, "-c", READ_ONLY_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert lines[-1] == "alive"
    results = dict(line.split(" -> ", 1) for line in lines[:-1])
    assert results == {
        "ring": "out is read-only memory",
        "paged": "out is read-only memory",
        "slots": "out is read-only memory",
        "block_table": "buffer is read-only memory",
        "tokens": "buffer is read-only memory",
        "bytes array": "out is read-only",
        "grouped": "buffers[0]['x'] is read-only memory",
        "qwen": "slot_mapping is read-only memory",
    }


def test_writable_memory_from_outside_torch_is_accepted(tmp_path: Path) -> None:
    import mmap

    path = tmp_path / "table.bin"
    path.write_bytes(bytes(64))
    with path.open("r+b") as handle:
        memory = mmap.mmap(handle.fileno(), 64)
        out = torch.from_numpy(np.frombuffer(memory, dtype=np.int32)).view(2, 8)
        ring_block_table([[1, 2], [3]], 8, out=out)
        check_writable(out, "out")  # cached: no second read of /proc/self/maps needed
        table = BlockTable(2, 8, buffer=torch.from_numpy(np.zeros(16, dtype=np.int32)))
        table.write_row(0, [4])
        del out, table
        gc.collect()
        memory.close()
    assert np.frombuffer(path.read_bytes(), dtype=np.int32)[:8].tolist() == [1, 2] * 4
    if sys.platform.startswith("linux"):
        array = np.zeros(1024, dtype=np.int32)
        assert mapped_writable(array.ctypes.data, array.nbytes) is True
        assert mapped_writable(0, 4096) is False  # page 0 is never mapped


# --- 4. device mirror: copies fenced before the next host write ----------------------------------


class DeferredDevice:
    """A stand-in accelerator: copies and kernels queue up, and run only when a fence is waited
    on (everything before the fence) or :meth:`run_all` is called. A copy reads its source when it
    runs, as a non-blocking copy from pinned memory does."""

    def __init__(self) -> None:
        self.queue: list[Callable[[], None]] = []
        self.done = 0

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        def run() -> None:
            dst.copy_(src)

        self.queue.append(run)

    def record(self) -> MirrorFence:
        return _Fence(self, len(self.queue))

    def launch(self, kernel: Callable[[], None]) -> None:
        self.queue.append(kernel)

    def run_to(self, position: int) -> None:
        while self.done < position:
            self.queue[self.done]()
            self.done += 1

    def run_all(self) -> None:
        self.run_to(len(self.queue))


class _Fence:
    def __init__(self, device: DeferredDevice, position: int) -> None:
        self.device, self.position = device, position

    def synchronize(self) -> None:
        self.device.run_to(self.position)


def _mirror_steps(wait: bool) -> list[torch.Tensor]:
    device = DeferredDevice()
    host = torch.zeros(4, 3, dtype=torch.int32)
    mirror = DeviceMirror(host, "cpu", separate=True, copier=device)
    seen: list[torch.Tensor] = []
    for step in range(1, 6):
        if wait:
            mirror.wait_host_free()
        host.fill_(step)
        mirror.sync([1, 2] if step % 2 else None)
        device.launch(lambda: seen.append(mirror.tensor.clone()))  # step's kernel reads it
    device.run_all()
    return seen


def test_device_mirror_fence_keeps_each_steps_copies_on_its_own_step() -> None:
    fenced = _mirror_steps(wait=True)
    for step, seen in enumerate(fenced, 1):
        rows = [1, 2] if step % 2 else [0, 1, 2, 3]
        assert bool((seen[rows] == step).all()), (step, seen)
    # The stand-in has teeth: without the fence, an early step's copies read a later step.
    unfenced = _mirror_steps(wait=False)
    assert not bool((unfenced[0][[1, 2]] == 1).all())


def _qwen_steps(count: int) -> list[DecodeBatch]:
    """Three requests decoding ``count`` steps, one token each, a page every 4 tokens."""
    pools = [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25], [30, 31, 32, 33, 34, 35]]
    starts = [3, 6, 1]
    batches = []
    for step in range(count):
        lens = [start + step for start in starts]
        batches.append(
            DecodeBatch(
                request_ids=["a", "b", "c"],
                token_ids=torch.tensor([100 + step, 200 + step, 300 + step]),
                hidden_states=None,
                seq_lens=torch.tensor(lens),
                block_ids=[pool[: math.ceil(n / 4)] for pool, n in zip(pools, lens, strict=True)],
            )
        )
    return batches


def _qwen_run(monkeypatch: pytest.MonkeyPatch, *, fence: bool, small: bool) -> bool:
    """Prepare every step through a preparer whose mirrors copy on a :class:`DeferredDevice`;
    each step's kernel snapshots the device buffers. Whether every snapshot equals what a
    host-only preparer holds after the same step."""
    device = DeferredDevice()

    def deferred_mirror(host: torch.Tensor, _device: object, **_: Any) -> DeviceMirror:
        return DeviceMirror(host, "cpu", separate=True, copier=device)

    plain = QwenDecodePreparer(4, 24, page_size=4)  # host buffers only: the expected values
    with monkeypatch.context() as patch:
        patch.setattr(qwen_module, "DeviceMirror", deferred_mirror)
        if not fence:
            patch.setattr(qwen_module, "wait_host_free", lambda *mirrors: None)
        preparer = QwenDecodePreparer(4, 24, page_size=4)
        if not small:
            preparer.row_loop_max = 0
        seen: list[list[torch.Tensor]] = []
        expected: list[list[torch.Tensor]] = []
        for batch in _qwen_steps(8):
            inputs = preparer.prepare(batch)
            assert inputs.block_table.data_ptr() != preparer.block_table.tensor.data_ptr()
            buffers = (inputs.token_ids, inputs.seq_lens, inputs.block_table, inputs.slot_mapping)
            device.launch(lambda buffers=buffers: seen.append([b.clone() for b in buffers]))
            host = plain.prepare(batch)
            expected.append(
                [
                    b.clone()
                    for b in (host.token_ids, host.seq_lens, host.block_table, host.slot_mapping)
                ]
            )
        device.run_all()
    return all(
        all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        for got, want in zip(seen, expected, strict=True)
    )


@pytest.mark.parametrize("small", [True, False], ids=["row-loop", "array-checks"])
def test_qwen_preparer_waits_for_the_last_steps_copies(
    monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    assert _qwen_run(monkeypatch, fence=True, small=small)
    assert not _qwen_run(monkeypatch, fence=False, small=small)  # the race the fence prevents


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_mirror_copies_read_their_own_step() -> None:
    """A busy stream delays every copy well past ``sync()``; each step's snapshot, queued after
    its copies, must still hold that step's values."""
    host = host_tensor((64, 1024), torch.int32, fill=0, pin_memory=True)
    mirror = DeviceMirror(host, "cuda")
    snapshots = []
    for step in range(1, 9):
        mirror.wait_host_free()
        host.fill_(step)
        torch.cuda._sleep(50_000_000)  # type: ignore[no-untyped-call]
        mirror.sync(list(range(0, 64, 2)) if step % 2 else None)
        snapshots.append(mirror.tensor.clone())
    torch.cuda.synchronize()
    for step, snapshot in enumerate(snapshots, 1):
        rows = slice(0, 64, 2) if step % 2 else slice(None)
        assert bool((snapshot[rows] == step).all()), step


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_qwen_preparer_buffers_match_the_host_preparer_every_step() -> None:
    preparer = QwenDecodePreparer(4, 24, page_size=4, device="cuda")
    plain = QwenDecodePreparer(4, 24, page_size=4)
    seen, expected = [], []
    for batch in _qwen_steps(8):
        torch.cuda._sleep(50_000_000)  # type: ignore[no-untyped-call]
        inputs = preparer.prepare(batch)
        seen.append([b.clone() for b in (inputs.token_ids, inputs.seq_lens, inputs.block_table)])
        host = plain.prepare(batch)
        expected.append([b.clone() for b in (host.token_ids, host.seq_lens, host.block_table)])
    torch.cuda.synchronize()
    for got, want in zip(seen, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.cpu(), b)


# --- 5. rope_theta from the transformers config --------------------------------------------------


# --- 6, 7, 8: bench without the test extra, the plot, the README ---------------------------------


def test_buffer_claims_survive_a_finalizer_releasing_one_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A garbage collection during the claim check may release another owner's claim (its
    finalizer pops it): the check takes the claims again instead of failing with Python's
    "dictionary changed size during iteration" (seen once in a CI run of the vLLM facade tests)."""
    from blockprep import buffers

    class Shifting(dict):  # type: ignore[type-arg]
        """Its first values() fails the way a dict changed under iteration does."""

        failed = False

        def values(self):  # type: ignore[no-untyped-def, override]
            if not Shifting.failed:
                Shifting.failed = True
                raise RuntimeError("dictionary changed size during iteration")
            return super().values()

    monkeypatch.setattr(buffers.host, "_CLAIMS", Shifting(buffers.host._CLAIMS))
    table = BlockTable(2, 4)
    assert Shifting.failed and table.write_row(0, [1, 2])


def test_grouped_issue_example_shared_table_and_counts_over_a_row_are_refused() -> None:
    """The issue's example (one tensor for two groups), and a counts tensor over a table's last
    row: refused, naming both buffers, nothing written."""
    shared = torch.zeros(3, 4, dtype=torch.int32)
    groups = [TableGroup("x", "ring", 4, id_limit=100), TableGroup("y", "ring", 4, id_limit=100)]
    with pytest.raises(ValueError, match=r"buffers\[0\]\['y'\] overlaps buffers\[0\]\['x'\]"):
        GroupedTables(groups, 3, buffers=[({"x": shared, "y": shared}, torch.zeros(3, 2).int())])
    tables, _ = grouped_slot()
    counts = tables["pages"].view(-1)[-6:].view(3, 2)  # over the table's last row
    before = tables["pages"].clone()
    with pytest.raises(ValueError, match=r"overlaps") as info:
        GroupedTables([RING, PAGED], 3, buffers=[(tables, counts)])
    assert isinstance(info.value, BlockprepError)
    assert torch.equal(tables["pages"], before)


@pytest.mark.parametrize("case", ["one tensor", "slots over the table's tail"])
def test_qwen_adopted_buffers_that_overlap_are_refused(case: str) -> None:
    """9ea27c1 checked each buffer alone: seq_lens read back as the slots, or the padding
    replication reset the slots to -1 (K/V written at slot -1)."""
    buffers = qwen_buffers()
    if case == "one tensor":
        buffers["slot_mapping"] = buffers["seq_lens"]
        words = r"slot_mapping overlaps seq_lens"
    else:
        buffers["slot_mapping"] = buffers["block_table"][-2:]
        words = r"slot_mapping overlaps block_table"
    before = {name: tensor.clone() for name, tensor in buffers.items()}
    with pytest.raises(ValueError, match=words) as info:
        QwenDecodePreparer(2, 16, 4, buffers=buffers)
    assert isinstance(info.value, BlockprepError)
    for name, tensor in buffers.items():
        assert torch.equal(tensor, before[name]), name
    # Disjoint buffers are adopted, and the first step equals the reference.
    QwenDecodePreparer(2, 16, 4, buffers=qwen_buffers())


def test_one_owner_per_byte_across_owners() -> None:
    """Two owners over the same memory would each trust a cache the other's writes falsify: the
    registry covers BlockTable, GroupedTables and the Qwen preparer alike, allocated buffers
    included; a refused owner claims nothing, a collected one releases its claims."""
    clash = "overlaps the buffer of another live"
    grouped = GroupedTables([RING, PAGED], 3)
    with pytest.raises(ValueError, match=f"^buffer {clash} GroupedTables"):
        BlockTable(3, PAGED.width, buffer=grouped.tables(0)["pages"])
    table = BlockTable(3, RING.width, kind="ring")
    tables, counts = grouped_slot()
    tables["swa"] = table.tensor
    with pytest.raises(ValueError, match=rf"^buffers\[0\]\['swa'\] {clash} BlockTable"):
        GroupedTables([RING, PAGED], 3, buffers=[(tables, counts)])
    # Refused as a whole: the buffers that did not clash were not left claimed.
    BlockTable(3, PAGED.width, buffer=tables["pages"])
    fresh = grouped_slot()
    first = GroupedTables([RING, PAGED], 3, buffers=[fresh])
    with pytest.raises(ValueError, match=f"{clash} GroupedTables"):
        GroupedTables([RING, PAGED], 3, buffers=[fresh])
    del first
    gc.collect()
    GroupedTables([RING, PAGED], 3, buffers=[fresh])  # released with its owner
    # Qwen: another live preparer's buffers, allocated or adopted. The table is its
    # BlockTable's, whose check names it "buffer".
    owner = QwenDecodePreparer(2, 16, 4)
    for name in ("token_ids", "seq_lens", "slot_mapping", "block_table"):
        buffers = qwen_buffers()
        buffers[name] = owner.buffers()[name]
        words = "buffer {} BlockTable" if name == "block_table" else name + " {} QwenDecodePreparer"
        with pytest.raises(ValueError, match="^" + words.format(clash)):
            QwenDecodePreparer(2, 16, 4, buffers=buffers)


def test_release_buffers_frees_an_owners_claims_now() -> None:
    tables = grouped_slot()
    grouped = GroupedTables([RING, PAGED], 3, buffers=[tables])
    with pytest.raises(ValueError, match="another live GroupedTables"):
        BlockTable(3, PAGED.width, buffer=tables[0]["pages"])
    release_buffers(grouped)
    release_buffers(grouped)  # a no-op the second time
    BlockTable(3, PAGED.width, buffer=tables[0]["pages"])


RING = TableGroup("swa", "ring", 4, id_limit=100)


PAGED = TableGroup("pages", "paged", 6, id_limit=100, pad=-1)


def grouped_slot(rows: int = 3) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    tables = {g.name: torch.full((rows, g.width), 7, dtype=torch.int32) for g in (RING, PAGED)}
    return tables, torch.full((rows, 2), 7, dtype=torch.int32)


def qwen_buffers(batch: int = 2, max_seq_len: int = 16, page: int = 4) -> dict[str, torch.Tensor]:
    return {
        "token_ids": torch.full((batch, 8), 7, dtype=torch.int32),
        "seq_lens": torch.full((batch,), 7, dtype=torch.int32),
        "block_table": torch.full((batch * (max_seq_len // page),), 7, dtype=torch.int32),
        "slot_mapping": torch.full((batch,), 7, dtype=torch.int32),
    }
