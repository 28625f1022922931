"""Proof that the prepared Qwen decode buffers drive a real decode.

A tiny random ``transformers.Qwen3ForCausalLM`` is the oracle: every decode step of
``blockprep.executors.torch_paged.TorchPagedQwen3Executor`` (which reads only the prepared buffers
and its paged KV cache) must reproduce the dense transformers forward of the same full sequence.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from blockprep import DecodeBatch, DecodeResult
from blockprep.adapters.qwen import QwenDecodeAdapter, QwenDecodeInputs, QwenDecodePreparer
from blockprep.executors.torch_paged import (
    Qwen3Dims,
    Qwen3Weights,
    TorchPagedQwen3Executor,
)

VOCAB = 512
PAGE = 4  # small pages: many page boundaries in a short run
MAX_SEQ = 64
MAX_BLOCKS = MAX_SEQ // PAGE
NUM_PAGES = 96
ROPE_THETA = 10_000.0
EPS = 1e-6
ATOL = 1e-4
RTOL = 1e-4


@pytest.fixture(scope="module")
def model() -> Qwen3ForCausalLM:
    """2 layers, hidden 64, 4 heads over 2 KV heads of 16, vocab 512, float32, eager attention.

    Weights are redrawn larger than the default init (std 0.02) so that the logits are spread
    out and the greedy token is never a near tie that float32 rounding could flip."""
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_SEQ,
        rms_norm_eps=EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    assert model.config._attn_implementation == "eager" and model.dtype == torch.float32
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:  # RMSNorm weights
                param.copy_(0.75 + 0.5 * torch.rand(param.shape, generator=generator))
            else:
                std = 1.0 if "embed_tokens" in name else 0.25
                param.copy_(std * torch.randn(param.shape, generator=generator))
    return model


def make_executor(model: Qwen3ForCausalLM) -> TorchPagedQwen3Executor:
    return TorchPagedQwen3Executor.from_state_dict(
        model.state_dict(),
        num_pages=NUM_PAGES,
        page_size=PAGE,
        rms_norm_eps=EPS,
        rope_theta=ROPE_THETA,
    )


@torch.no_grad()
def dense_logits(model: Qwen3ForCausalLM, sequence: list[int]) -> torch.Tensor:
    """``[len(sequence), vocab]`` float32: transformers' dense forward, no cache."""
    out = model(input_ids=torch.tensor([sequence]), use_cache=False)
    return out.logits[0].to(torch.float32)


def test_weights_from_state_dict_infer_dims(model: Qwen3ForCausalLM) -> None:
    weights = Qwen3Weights.from_state_dict(
        model.state_dict(), rms_norm_eps=EPS, rope_theta=ROPE_THETA
    )
    assert weights.dims == Qwen3Dims(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=EPS,
        rope_theta=ROPE_THETA,
    )
    # Copies, not views of the model's parameters.
    assert weights.embed_tokens.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    tied = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert torch.equal(Qwen3Weights.from_state_dict(tied).lm_head, weights.embed_tokens)
    with pytest.raises(ValueError, match="unexpected keys"):
        Qwen3Weights.from_state_dict(
            {**tied, "model.layers.0.self_attn.q_proj.bias": torch.ones(64)}
        )
    missing = {k: v for k, v in tied.items() if "layers.1.mlp.up_proj" not in k}
    with pytest.raises(ValueError, match=r"missing 'layers\.1\.mlp\.up_proj\.weight'"):
        Qwen3Weights.from_state_dict(missing)


def test_prefill_matches_transformers(model: Qwen3ForCausalLM) -> None:
    executor = make_executor(model)
    prompt = torch.randint(0, VOCAB, (13,), generator=torch.Generator().manual_seed(2)).tolist()
    pages = [41, 7, 90, 3]  # ceil(13 / 4) = 4 scattered pages
    logits = executor.prefill(prompt, pages)
    assert logits.shape == (13, VOCAB) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, dense_logits(model, prompt), atol=ATOL, rtol=RTOL)
    # Token t's K went to pages[t // PAGE] at offset t % PAGE; untouched pages stay zero.
    used = torch.zeros(NUM_PAGES, PAGE, dtype=torch.bool)
    for t in range(13):
        used[pages[t // PAGE], t % PAGE] = True
    for cache in (*executor.k_cache, *executor.v_cache):
        assert bool((cache[used].abs().sum(dim=(-1, -2)) > 0).all())
        assert not bool(cache[~used].any())
    with pytest.raises(ValueError, match="needs 4 pages of 4, got 3"):
        executor.prefill(prompt, pages[:3])
    with pytest.raises(ValueError, match=r"page_ids\[1\] = 96 outside \[0, 96\)"):
        executor.prefill(prompt, [1, NUM_PAGES, 2, 3])


@dataclass(frozen=True)
class HandBuiltInputs:
    """The Qwen decode ABI built by hand, independently of the preparer."""

    actual_batch: int
    token_ids: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


def hand_built(batch: int, rows: list[tuple[int, int, list[int]]]) -> HandBuiltInputs:
    """``rows`` = ``(token, seq_len, pages)`` per active request; rows past them replicate row 0."""
    padded = rows + [rows[0]] * (batch - len(rows))
    token_ids = torch.zeros(batch, 8, dtype=torch.int32)
    seq_lens = torch.zeros(batch, dtype=torch.int32)
    table = torch.full((batch, MAX_BLOCKS), -1, dtype=torch.int32)
    slots = torch.zeros(batch, dtype=torch.int32)
    for r, (token, seq_len, pages) in enumerate(padded):
        token_ids[r, 0] = token
        seq_lens[r] = seq_len
        table[r, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        t = seq_len - 1
        slots[r] = pages[t // PAGE] * PAGE + t % PAGE
    return HandBuiltInputs(len(rows), token_ids, seq_lens, table.reshape(-1), slots)


def test_executor_with_hand_built_buffers(model: Qwen3ForCausalLM) -> None:
    """Six greedy steps of three requests in a batch of 4 (row 3 replicates row 0), crossing
    page boundaries, without the preparer."""
    executor = make_executor(model)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (6, 3, 9)]
    pools = [[12, 70, 5, 33], [88, 1, 50], [64, 9, 27, 44, 2]]
    sequences = [list(p) for p in prompts]
    pending = []
    for prompt, pool in zip(prompts, pools, strict=True):
        pending.append(
            int(executor.prefill(prompt, pool[: math.ceil(len(prompt) / PAGE)])[-1].argmax())
        )
    for _ in range(6):
        rows = []
        for seq, pool, token in zip(sequences, pools, pending, strict=True):
            seq_len = len(seq) + 1
            rows.append((token, seq_len, pool[: math.ceil(seq_len / PAGE)]))
        result = executor.run_decode(hand_built(4, rows))
        assert result.hidden_states is None
        assert result.logits is not None and result.sampled_token_ids is not None
        assert result.logits.shape == (3, VOCAB) and result.logits.dtype == torch.float32
        for i, (seq, token) in enumerate(zip(sequences, pending, strict=True)):
            seq.append(token)
            expected = dense_logits(model, seq)[-1]
            torch.testing.assert_close(result.logits[i], expected, atol=ATOL, rtol=RTOL)
            assert int(result.sampled_token_ids[i]) == int(expected.argmax())
        pending = [int(t) for t in result.sampled_token_ids]


def test_wrong_slot_is_caught(model: Qwen3ForCausalLM) -> None:
    """The proof has teeth: a slot mapping that disagrees with the block table (the current
    token's K/V lands one offset off) gives logits that miss the oracle."""
    executor = make_executor(model)
    prompt = list(range(100, 105))
    pages = [20, 21]
    token = int(executor.prefill(prompt, pages)[-1].argmax())
    good = hand_built(2, [(token, 6, pages)])
    wrong_slot = good.slot_mapping.clone()
    wrong_slot[:] = good.slot_mapping[0] + 1  # position 6's cell instead of position 5's
    bad = HandBuiltInputs(1, good.token_ids, good.seq_lens, good.block_table, wrong_slot)
    logits = executor.run_decode(bad).logits
    assert logits is not None
    expected = dense_logits(model, [*prompt, token])[-1]
    assert float((logits[0] - expected).abs().max()) > 1e-2


def test_bad_buffers_rejected_before_the_cache_is_touched(model: Qwen3ForCausalLM) -> None:
    executor = make_executor(model)
    executor.prefill([1, 2, 3], [4])
    before = [c.clone() for c in (*executor.k_cache, *executor.v_cache)]
    good = hand_built(2, [(7, 4, [4])])
    table = good.block_table.clone()
    table[:] = -1  # seq_len 4 needs column 0
    cases = {
        r"row 0: block_table\[0, 0\] = -1 outside \[0, 96\)": HandBuiltInputs(
            1, good.token_ids, good.seq_lens, table, good.slot_mapping
        ),
        r"row 1: slot 384 outside KV cache \[0, 384\)": HandBuiltInputs(
            1, good.token_ids, good.seq_lens, good.block_table, torch.tensor([19, 384])
        ),
        r"token_ids\[1\] = 512 outside vocabulary": HandBuiltInputs(
            1,
            torch.tensor([[7] + [0] * 7, [VOCAB] + [0] * 7]),
            good.seq_lens,
            good.block_table,
            good.slot_mapping,
        ),
        r"row 0: seq_len 0 outside \[1, 64\]": HandBuiltInputs(
            1, good.token_ids, torch.tensor([0, 4]), good.block_table, good.slot_mapping
        ),
        r"actual_batch 3 outside \[1, 2\]": HandBuiltInputs(
            3, good.token_ids, good.seq_lens, good.block_table, good.slot_mapping
        ),
        r"block_table of 31 ids is not 2 equal rows": HandBuiltInputs(
            1, good.token_ids, good.seq_lens, good.block_table[:31], good.slot_mapping
        ),
    }
    for message, inputs in cases.items():
        with pytest.raises(ValueError, match=message):
            executor.run_decode(inputs)
    after = [*executor.k_cache, *executor.v_cache]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


# ----------------------------------------------------------------------------- end to end


@dataclass
class Request:
    request_id: str
    prompt_len: int
    join_step: int
    decode_steps: int


# Batch of 4: 2 active at first, 4 at the peak, 1 at the end; R1 and R3 finish mid-way and
# their pages are reused by later requests.
PLAN = [
    Request("r0", prompt_len=5, join_step=0, decode_steps=30),
    Request("r1", prompt_len=11, join_step=0, decode_steps=14),
    Request("r2", prompt_len=3, join_step=4, decode_steps=40),
    Request("r3", prompt_len=17, join_step=10, decode_steps=20),
    Request("r4", prompt_len=8, join_step=18, decode_steps=25),
]
MAX_BATCH = 4


class Recording:
    """Passes the prepared inputs on to the executor and keeps them."""

    def __init__(self, executor: TorchPagedQwen3Executor) -> None:
        self.executor = executor
        self.seen: list[QwenDecodeInputs] = []

    def run_decode(self, inputs: QwenDecodeInputs) -> DecodeResult:
        self.seen.append(inputs)
        return self.executor.run_decode(inputs)


@dataclass
class Live:
    request: Request
    sequence: list[int]  # tokens already in the KV cache
    pending: int  # the token this step decodes
    pages: list[int]
    left: int


def test_prepared_buffers_drive_a_real_decode(model: Qwen3ForCausalLM) -> None:
    rng = random.Random(1234)
    gen = torch.Generator().manual_seed(4)
    pool = list(range(NUM_PAGES))
    rng.shuffle(pool)

    executor = make_executor(model)
    preparer = QwenDecodePreparer(
        max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ, page_size=PAGE, sampled_ids_pad=8
    )
    recorder = Recording(executor)
    adapter = QwenDecodeAdapter(preparer, recorder)

    live: list[Live] = []
    sizes: list[int] = []
    max_diff = 0.0
    step = 0
    min_margin = math.inf

    while step == 0 or live:
        for request in PLAN:
            if request.join_step == step:
                prompt = torch.randint(0, VOCAB, (request.prompt_len,), generator=gen).tolist()
                pages = [pool.pop() for _ in range(math.ceil(len(prompt) / PAGE))]
                logits = executor.prefill(prompt, pages)
                expected = dense_logits(model, prompt)
                torch.testing.assert_close(logits, expected, atol=ATOL, rtol=RTOL)
                max_diff = max(max_diff, float((logits - expected).abs().max()))
                first = int(logits[-1].argmax())
                assert first == int(expected[-1].argmax())
                live.append(Live(request, prompt, first, pages, request.decode_steps))
        assert 1 <= len(live) <= MAX_BATCH
        if rng.random() < 0.5:
            rng.shuffle(live)  # requests change kernel rows
        for entry in live:
            seq_len = len(entry.sequence) + 1
            while len(entry.pages) < math.ceil(seq_len / PAGE):
                entry.pages.append(pool.pop())

        token_ids = torch.tensor([e.pending for e in live])
        batch = DecodeBatch(
            request_ids=[e.request.request_id for e in live],
            token_ids=token_ids if step % 2 else token_ids[:, None],
            hidden_states=None,
            seq_lens=torch.tensor([len(e.sequence) + 1 for e in live]),
            block_ids=[list(e.pages) for e in live],
        )
        result = adapter.run_decode(batch)
        sizes.append(len(live))

        assert recorder.seen[-1].actual_batch == len(live)
        assert result.logits is not None and result.sampled_token_ids is not None
        assert result.logits.shape == (len(live), VOCAB)
        assert result.logits.dtype == torch.float32
        for i, entry in enumerate(live):
            entry.sequence.append(entry.pending)
            expected = dense_logits(model, entry.sequence)[-1]
            torch.testing.assert_close(
                result.logits[i],
                expected,
                atol=ATOL,
                rtol=RTOL,
                msg=lambda m, e=entry, s=step: f"step {s} {e.request.request_id}: {m}",
            )
            max_diff = max(max_diff, float((result.logits[i] - expected).abs().max()))
            assert int(result.sampled_token_ids[i]) == int(expected.argmax()), (step, i)
            top2 = expected.topk(2).values
            min_margin = min(min_margin, float(top2[0] - top2[1]))
            entry.pending = int(result.sampled_token_ids[i])
            entry.left -= 1
        for entry in [e for e in live if e.left == 0]:
            live.remove(entry)
            for page in entry.pages:  # freed pages go back anywhere in the pool
                pool.insert(rng.randrange(len(pool) + 1), page)
        step += 1

    assert step >= 40
    assert max(sizes) == MAX_BATCH and min(sizes) == 1 and 2 in sizes and 3 in sizes
    # The executor was handed the preparer's persistent buffers, the same objects every step.
    for field in ("token_ids", "seq_lens", "block_table", "slot_mapping"):
        assert len({id(getattr(inputs, field)) for inputs in recorder.seen}) == 1, field
    assert max_diff < ATOL
    print(
        f"\n{step} decode steps, batch sizes {sorted(set(sizes))}, "
        f"max |dlogit| {max_diff:.2e}, min greedy top-2 margin {min_margin:.2e}"
    )


def test_executor_built_from_transformers_takes_the_configs_rope_theta() -> None:
    transformers = pytest.importorskip("transformers")
    from blockprep.executors.torch_paged import TorchPagedQwen3Executor

    config = transformers.Qwen3Config(  # rope_theta left at Qwen3Config's default, 10,000
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.5)
    prompt = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        dense = model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0]
    executor = TorchPagedQwen3Executor.from_transformers(model, num_pages=16, page_size=4)
    assert executor.dims.rope_theta == 10_000.0
    logits = executor.prefill(prompt, list(range(10)))
    assert float((logits - dense).abs().max()) < 1e-3
    # The old way, the state dict alone, takes 1e6 and misses the model.
    blind = TorchPagedQwen3Executor.from_state_dict(model.state_dict(), num_pages=16, page_size=4)
    assert float((blind.prefill(prompt, list(range(10))) - dense).abs().max()) > 1e-2
    with pytest.raises(ValueError, match=r"rope_theta=1000000\.0 disagrees"):
        TorchPagedQwen3Executor.from_state_dict(
            model.state_dict(), num_pages=16, page_size=4, rope_theta=1e6, config=config
        )
