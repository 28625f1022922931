"""A reference Qwen3 decode executor in plain torch over a paged KV cache, driven only by the
prepared decode buffers.

It is the CPU stand-in for the fixed-shape compiled decode program: ``run_decode(inputs)`` reads
the persistent buffers that :class:`blockprep.adapters.qwen.QwenDecodePreparer` writes (token ids
column 0, ``seq_lens``, the flat block table viewed as ``[B, max_blocks]``, ``slot_mapping``) and
the executor's own paged KV cache, and nothing else. It computes all ``B`` kernel rows (padding
rows replicate row 0 and rewrite row 0's slot with identical values, as on the device), then trims
the result to ``inputs.actual_batch``.

The math is the Qwen3 decoder (``transformers`` ``Qwen3ForCausalLM`` with default RoPE, no
attention bias, no sliding window): embedding, per layer RMSNorm -> q/k/v projections -> per-head
q/k RMSNorm -> RoPE at the token's absolute position -> K/V written at its slot -> K/V gathered
through the block table for positions ``0 .. seq_len - 1`` -> grouped-query attention -> output
projection -> residual -> RMSNorm -> SiLU-gated MLP -> residual; final RMSNorm and ``lm_head``.
``transformers`` is not imported here; it is only the test oracle.

Prefill (:meth:`TorchPagedQwen3Executor.prefill`) runs the same code path over a whole prompt:
every prompt token's K/V is written into the request's pages at
``pages[t // page_size] * page_size + t % page_size``, and each prompt position attends, through
the same page list, to positions ``0 .. t``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from blockprep.batch import DecodeResult
from blockprep.errors import BlockprepValueError

__all__ = [
    "PagedDecodeInputs",
    "Qwen3Dims",
    "Qwen3LayerWeights",
    "Qwen3Weights",
    "TorchPagedQwen3Executor",
]


class PagedDecodeInputs(Protocol):
    """The prepared paged-decode ABI the executor reads (``QwenDecodeInputs`` satisfies it).

    - ``actual_batch``: active rows ``A``, ``1 <= A <= B``.
    - ``token_ids``: ``[B, W]`` integer, ``W >= 1``; column 0 is each row's current token.
    - ``seq_lens``: ``[B]`` integer, tokens including the current one (position ``seq_len - 1``).
    - ``block_table``: ``[B * max_blocks]`` (or ``[B, max_blocks]``) integer page ids.
    - ``slot_mapping``: ``[B]`` integer KV slot of the current token.
    """

    @property
    def actual_batch(self) -> int: ...

    @property
    def token_ids(self) -> torch.Tensor: ...

    @property
    def seq_lens(self) -> torch.Tensor: ...

    @property
    def block_table(self) -> torch.Tensor: ...

    @property
    def slot_mapping(self) -> torch.Tensor: ...


@dataclass(frozen=True)
class Qwen3Dims:
    """The architecture numbers of a Qwen3 decoder (``transformers.Qwen3Config`` equivalents)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BlockprepValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise BlockprepValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise BlockprepValueError(f"head_dim must be even for RoPE, got {self.head_dim}")


@dataclass(frozen=True)
class Qwen3LayerWeights:
    """One decoder layer's weights, ``nn.Linear`` layout ``[out_features, in_features]``.

    ``q_proj [heads*head_dim, hidden]``, ``k_proj``/``v_proj [kv_heads*head_dim, hidden]``,
    ``o_proj [hidden, heads*head_dim]``, ``q_norm``/``k_norm [head_dim]``,
    ``input_layernorm``/``post_attention_layernorm [hidden]``, ``gate_proj``/``up_proj
    [intermediate, hidden]``, ``down_proj [hidden, intermediate]``.
    """

    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    input_layernorm: torch.Tensor
    post_attention_layernorm: torch.Tensor
    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor


_LAYER_KEYS: dict[str, str] = {
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^layers\.(\d+)\.")


@dataclass(frozen=True)
class Qwen3Weights:
    """All weights of a Qwen3 causal LM: ``embed_tokens [vocab, hidden]``, ``layers``,
    ``norm [hidden]`` and ``lm_head [vocab, hidden]`` (the embedding itself when tied)."""

    dims: Qwen3Dims
    embed_tokens: torch.Tensor
    layers: tuple[Qwen3LayerWeights, ...]
    norm: torch.Tensor
    lm_head: torch.Tensor

    @classmethod
    def from_state_dict(
        cls,
        state_dict: Mapping[str, torch.Tensor],
        *,
        rms_norm_eps: float | None = None,
        rope_theta: float | None = None,
        dtype: torch.dtype = torch.float32,
        config: Any = None,
    ) -> Qwen3Weights:
        """Build from a Hugging Face style Qwen3 ``state_dict``.

        ``config``: the model's ``transformers.Qwen3Config`` (or any object with its attributes).
        When given, ``rms_norm_eps`` and ``rope_theta`` come from it (:func:`config_numbers`; an
        explicit value that differs raises ``ValueError``) and its head counts, sizes and layer
        count must match the state dict's. Without it they default to ``1e-6`` and ``1e6`` (the
        released Qwen3 checkpoints' values; ``Qwen3Config()`` itself defaults ``rope_theta`` to
        10,000, so pass the config or the value when the model was built from a bare config).

        Keys are ``[model.]embed_tokens.weight``, ``[model.]layers.{i}.self_attn.{q,k,v,o}_proj
        .weight``, ``...self_attn.{q,k}_norm.weight``, ``...{input,post_attention}_layernorm
        .weight``, ``...mlp.{gate,up,down}_proj.weight``, ``[model.]norm.weight`` and optionally
        ``lm_head.weight`` (tied embeddings when absent). The dims are inferred from the shapes;
        ``rms_norm_eps`` and ``rope_theta`` are not in a state dict and must match the config.
        Tensors are detached, cast to ``dtype`` and copied. Raises ``ValueError`` on a missing,
        unexpected (e.g. an attention bias) or mis-shaped key.
        """
        rms_norm_eps, rope_theta = _numbers(config, rms_norm_eps, rope_theta)
        sd: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            name = key[len("model.") :] if key.startswith("model.") else key
            sd[name] = value.detach().to(dtype=dtype, copy=True)
        layer_ids = sorted({int(m.group(1)) for k in sd if (m := _LAYER_RE.match(k))})
        if not layer_ids or layer_ids != list(range(len(layer_ids))):
            raise BlockprepValueError(f"state_dict layers must be numbered 0..n-1, got {layer_ids}")

        def take(name: str) -> torch.Tensor:
            try:
                return sd.pop(name)
            except KeyError:
                raise BlockprepValueError(f"state_dict is missing {name!r}") from None

        embed = take("embed_tokens.weight")
        norm = take("norm.weight")
        lm_head = sd.pop("lm_head.weight", embed)
        layers = tuple(
            Qwen3LayerWeights(**{f: take(f"layers.{i}.{k}") for f, k in _LAYER_KEYS.items()})
            for i in layer_ids
        )
        if sd:
            raise BlockprepValueError(f"state_dict has unexpected keys: {sorted(sd)}")
        first = layers[0]
        head_dim = int(first.q_norm.shape[0])
        dims = Qwen3Dims(
            vocab_size=int(embed.shape[0]),
            hidden_size=int(embed.shape[1]),
            intermediate_size=int(first.gate_proj.shape[0]),
            num_layers=len(layers),
            num_heads=int(first.q_proj.shape[0]) // head_dim,
            num_kv_heads=int(first.k_proj.shape[0]) // head_dim,
            head_dim=head_dim,
            rms_norm_eps=rms_norm_eps,
            rope_theta=rope_theta,
        )
        if config is not None:
            _check_config_dims(config, dims)
        weights = cls(dims=dims, embed_tokens=embed, layers=layers, norm=norm, lm_head=lm_head)
        weights.check_shapes()
        return weights

    def check_shapes(self) -> None:
        """Raise ``ValueError`` naming the first tensor whose shape disagrees with ``dims``."""
        d = self.dims
        q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
        expected: list[tuple[str, torch.Tensor, tuple[int, ...]]] = [
            ("embed_tokens", self.embed_tokens, (d.vocab_size, d.hidden_size)),
            ("norm", self.norm, (d.hidden_size,)),
            ("lm_head", self.lm_head, (d.vocab_size, d.hidden_size)),
        ]
        if len(self.layers) != d.num_layers:
            raise BlockprepValueError(f"{len(self.layers)} layers given, dims say {d.num_layers}")
        for i, w in enumerate(self.layers):
            expected += [
                (f"layers.{i}.q_proj", w.q_proj, (q, d.hidden_size)),
                (f"layers.{i}.k_proj", w.k_proj, (kv, d.hidden_size)),
                (f"layers.{i}.v_proj", w.v_proj, (kv, d.hidden_size)),
                (f"layers.{i}.o_proj", w.o_proj, (d.hidden_size, q)),
                (f"layers.{i}.q_norm", w.q_norm, (d.head_dim,)),
                (f"layers.{i}.k_norm", w.k_norm, (d.head_dim,)),
                (f"layers.{i}.input_layernorm", w.input_layernorm, (d.hidden_size,)),
                (
                    f"layers.{i}.post_attention_layernorm",
                    w.post_attention_layernorm,
                    (d.hidden_size,),
                ),
                (f"layers.{i}.gate_proj", w.gate_proj, (d.intermediate_size, d.hidden_size)),
                (f"layers.{i}.up_proj", w.up_proj, (d.intermediate_size, d.hidden_size)),
                (f"layers.{i}.down_proj", w.down_proj, (d.hidden_size, d.intermediate_size)),
            ]
        for name, tensor, shape in expected:
            if tuple(tensor.shape) != shape:
                raise BlockprepValueError(
                    f"{name} has shape {tuple(tensor.shape)}, expected {shape}"
                )


def config_numbers(config: Any) -> tuple[float, float]:
    """``(rope_theta, rms_norm_eps)`` of a ``transformers`` Qwen3 config: ``rope_parameters``
    (transformers 5) or ``rope_theta`` and ``rope_scaling`` (earlier). Raises ``ValueError`` for
    a RoPE type other than the default one (this executor implements only that) or a config
    without ``rope_theta``."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise BlockprepValueError("the config has no rope_theta")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise BlockprepValueError(f"RoPE type {rope_type!r} is not supported, only 'default'")
    return float(theta), float(config.rms_norm_eps)


def _numbers(
    config: Any, rms_norm_eps: float | None, rope_theta: float | None
) -> tuple[float, float]:
    """``(rms_norm_eps, rope_theta)``: the config's when given (explicit values must agree),
    else the explicit values or the Qwen3 checkpoints' defaults."""
    if config is None:
        return (
            1e-6 if rms_norm_eps is None else rms_norm_eps,
            1_000_000.0 if rope_theta is None else rope_theta,
        )
    theta, eps = config_numbers(config)
    for name, given, found in (
        ("rms_norm_eps", rms_norm_eps, eps),
        ("rope_theta", rope_theta, theta),
    ):
        if given is not None and given != found:
            raise BlockprepValueError(f"{name}={given} disagrees with the config's {found}")
    return eps, theta


def _check_config_dims(config: Any, dims: Qwen3Dims) -> None:
    """The config's sizes must be those inferred from the state dict."""
    pairs = (
        ("vocab_size", dims.vocab_size),
        ("hidden_size", dims.hidden_size),
        ("intermediate_size", dims.intermediate_size),
        ("num_hidden_layers", dims.num_layers),
        ("num_attention_heads", dims.num_heads),
        ("num_key_value_heads", dims.num_kv_heads),
        ("head_dim", dims.head_dim),
    )
    for name, inferred in pairs:
        value = getattr(config, name, None)
        if value is not None and value != inferred:
            raise BlockprepValueError(f"config {name}={value} but the state dict has {inferred}")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm over the last dim, computed in float32 and cast back to ``x.dtype``."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class TorchPagedQwen3Executor:
    """Reference Qwen3 decode executor: plain torch, CPU, paged KV cache.

    The cache is, per layer, ``k_cache[layer]`` and ``v_cache[layer]`` of shape
    ``[num_pages, page_size, num_kv_heads, head_dim]`` and the weights' dtype, zero-initialised.
    Slot ``s`` is ``(page s // page_size, offset s % page_size)``.

    Usage: :meth:`prefill` each request's prompt into its pages, then call :meth:`run_decode`
    (directly or through ``QwenDecodeAdapter``) once per step with the prepared buffers::

        executor = TorchPagedQwen3Executor.from_transformers(hf_model, num_pages=96, page_size=4)
        first = int(executor.prefill(prompt, pages)[-1].argmax())
        preparer = QwenDecodePreparer(max_batch_size=4, max_seq_len=64, page_size=4)
        result = QwenDecodeAdapter(preparer, executor).run_decode(
            DecodeBatch(["r0"], torch.tensor([first]), torch.tensor([len(prompt) + 1]),
                        block_ids=[pages])
        )
    """

    def __init__(self, weights: Qwen3Weights, *, num_pages: int, page_size: int) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise BlockprepValueError(
                f"num_pages and page_size must be positive, got {num_pages} and {page_size}"
            )
        weights.check_shapes()
        self.weights = weights
        self.dims = weights.dims
        self.num_pages = num_pages
        self.page_size = page_size
        self.dtype = weights.embed_tokens.dtype
        d = self.dims
        shape = (num_pages, page_size, d.num_kv_heads, d.head_dim)
        self.k_cache: list[torch.Tensor] = [
            torch.zeros(shape, dtype=self.dtype) for _ in range(d.num_layers)
        ]
        self.v_cache: list[torch.Tensor] = [
            torch.zeros(shape, dtype=self.dtype) for _ in range(d.num_layers)
        ]
        self._inv_freq = 1.0 / (
            d.rope_theta ** (torch.arange(0, d.head_dim, 2, dtype=torch.float32) / d.head_dim)
        )

    @classmethod
    def from_state_dict(
        cls,
        state_dict: Mapping[str, torch.Tensor],
        *,
        num_pages: int,
        page_size: int,
        rms_norm_eps: float | None = None,
        rope_theta: float | None = None,
        dtype: torch.dtype = torch.float32,
        config: Any = None,
    ) -> TorchPagedQwen3Executor:
        """Shorthand for ``TorchPagedQwen3Executor(Qwen3Weights.from_state_dict(...), ...)``."""
        weights = Qwen3Weights.from_state_dict(
            state_dict,
            rms_norm_eps=rms_norm_eps,
            rope_theta=rope_theta,
            dtype=dtype,
            config=config,
        )
        return cls(weights, num_pages=num_pages, page_size=page_size)

    @classmethod
    def from_transformers(
        cls,
        model: Any,
        *,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype = torch.float32,
    ) -> TorchPagedQwen3Executor:
        """From a ``transformers`` ``Qwen3ForCausalLM`` (or ``Qwen3Model``): its weights, and
        ``rope_theta`` and ``rms_norm_eps`` from its ``config`` (never a default that may differ
        from the model's)."""
        return cls.from_state_dict(
            model.state_dict(),
            num_pages=num_pages,
            page_size=page_size,
            dtype=dtype,
            config=model.config,
        )

    def reset_cache(self) -> None:
        """Zero every page of every layer's K and V cache."""
        for t in (*self.k_cache, *self.v_cache):
            t.zero_()

    # ------------------------------------------------------------------ entry points

    @torch.no_grad()
    def prefill(
        self, token_ids: torch.Tensor | Sequence[int], page_ids: Sequence[int]
    ) -> torch.Tensor:
        """Run a prompt through the model, writing its K/V into ``page_ids``; return its logits.

        ``token_ids``: ``[T]`` integer tokens at positions ``0 .. T-1`` (``T >= 1``).
        ``page_ids``: the request's pages, at least ``ceil(T / page_size)`` of them (more are
        allowed: the pages the decode steps will use next). Token ``t``'s K/V goes to page
        ``page_ids[t // page_size]``, offset ``t % page_size`` — the slot the decode ABI computes
        for ``seq_len = t + 1`` — and position ``t`` attends to ``0 .. t`` through the same
        pages. Returns ``[T, vocab]`` float32 logits; row ``T-1`` predicts the first decode token.
        Raises ``ValueError`` for an empty prompt, an out-of-vocab token, too few pages or a
        page id outside ``[0, num_pages)``.
        """
        tokens = torch.as_tensor(token_ids).reshape(-1).to(torch.int64)
        n = int(tokens.numel())
        if n == 0:
            raise BlockprepValueError("prefill needs at least one token")
        pages = [int(p) for p in page_ids]
        needed = -(-n // self.page_size)
        if len(pages) < needed:
            raise BlockprepValueError(
                f"prefill of {n} tokens needs {needed} pages of {self.page_size}, got {len(pages)}"
            )
        for j, page in enumerate(pages[:needed]):
            if not 0 <= page < self.num_pages:
                raise BlockprepValueError(
                    f"prefill page_ids[{j}] = {page} outside [0, {self.num_pages})"
                )
        self._check_tokens(tokens, "prefill token_ids")
        positions = torch.arange(n, dtype=torch.int64)
        table = torch.tensor(pages[:needed], dtype=torch.int64)
        slots = table[positions // self.page_size] * self.page_size + positions % self.page_size
        return self._forward(tokens, positions, slots, table.expand(n, needed), positions + 1)

    @torch.no_grad()
    def run_decode(self, inputs: PagedDecodeInputs) -> DecodeResult:
        """Run one decode step for all ``B`` kernel rows of the prepared buffers.

        Reads ``inputs.token_ids[:, 0]``, ``inputs.seq_lens``, ``inputs.block_table`` (viewed as
        ``[B, max_blocks]``) and ``inputs.slot_mapping``; writes each row's new K/V at its slot,
        then attends over positions ``0 .. seq_len - 1`` gathered through its block-table row.
        Returns ``DecodeResult(logits=[A, vocab] float32, sampled_token_ids=[A] int64 argmax,
        hidden_states=None)`` with ``A = inputs.actual_batch``.

        Like a kernel's bounds check, raises ``ValueError`` (naming the row and value) before
        touching the cache when a buffer has the wrong shape, a seq_len is outside
        ``[1, max_blocks * page_size]``, a token is outside the vocabulary, a slot is outside the
        cache, or a page id the row needs (columns ``< ceil(seq_len / page_size)``) is outside
        ``[0, num_pages)``. It does *not* check that the slot agrees with the block table: a
        preparer that gets that wrong produces wrong attention, which is what the tests catch.
        """
        seq_lens = inputs.seq_lens.reshape(-1).to(torch.int64)
        batch = int(seq_lens.numel())
        actual = int(inputs.actual_batch)
        if batch == 0 or not 1 <= actual <= batch:
            raise BlockprepValueError(f"actual_batch {actual} outside [1, {batch}]")
        token_buf = inputs.token_ids
        if token_buf.dim() != 2 or token_buf.shape[0] != batch or token_buf.shape[1] < 1:
            raise BlockprepValueError(
                f"token_ids must be [{batch}, width >= 1], got {tuple(token_buf.shape)}"
            )
        tokens = token_buf[:, 0].to(torch.int64)
        slots = inputs.slot_mapping.reshape(-1).to(torch.int64)
        if slots.numel() != batch:
            raise BlockprepValueError(f"slot_mapping has {slots.numel()} rows, expected {batch}")
        flat = inputs.block_table.reshape(-1)
        if flat.numel() == 0 or flat.numel() % batch:
            raise BlockprepValueError(
                f"block_table of {flat.numel()} ids is not {batch} equal rows"
            )
        table = flat.view(batch, -1).to(torch.int64)
        max_blocks = int(table.shape[1])

        self._check_tokens(tokens, "token_ids")
        capacity = self.num_pages * self.page_size
        for r, (s, slot) in enumerate(zip(seq_lens.tolist(), slots.tolist(), strict=True)):
            if not 1 <= s <= max_blocks * self.page_size:
                raise BlockprepValueError(
                    f"row {r}: seq_len {s} outside [1, {max_blocks * self.page_size}] "
                    f"(max_blocks {max_blocks} x page_size {self.page_size})"
                )
            if not 0 <= slot < capacity:
                raise BlockprepValueError(f"row {r}: slot {slot} outside KV cache [0, {capacity})")
            needed = -(-s // self.page_size)
            row = table[r, :needed]
            bad = ((row < 0) | (row >= self.num_pages)).nonzero()
            if bad.numel():
                j = int(bad[0, 0])
                raise BlockprepValueError(
                    f"row {r}: block_table[{r}, {j}] = {int(row[j])} outside [0, "
                    f"{self.num_pages}) but seq_len {s} needs {needed} pages"
                )

        logits = self._forward(tokens, seq_lens - 1, slots, table, seq_lens)[:actual]
        return DecodeResult(
            hidden_states=None, logits=logits, sampled_token_ids=logits.argmax(dim=-1)
        )

    # ------------------------------------------------------------------ the model

    def _check_tokens(self, tokens: torch.Tensor, what: str) -> None:
        bad = ((tokens < 0) | (tokens >= self.dims.vocab_size)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise BlockprepValueError(
                f"{what}[{i}] = {int(tokens[i])} outside vocabulary [0, {self.dims.vocab_size})"
            )

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` of shape ``[N, head_dim]`` for integer ``positions [N]`` (HF layout:
        the half-size frequency table concatenated with itself)."""
        freqs = positions[:, None].to(torch.float32) * self._inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        tables: torch.Tensor,
        kv_lens: torch.Tensor,
    ) -> torch.Tensor:
        """The shared decode/prefill body for ``N`` query rows, all int64 ``[N]`` except
        ``tables [N, W]``: row ``i`` embeds ``tokens[i]`` at ``positions[i]``, writes its K/V at
        ``slots[i]`` and attends to positions ``0 .. kv_lens[i] - 1`` through ``tables[i]``.
        All rows write before any row reads, per layer. Returns ``[N, vocab]`` float32 logits."""
        d, w, page_size = self.dims, self.weights, self.page_size
        n = int(tokens.numel())
        groups = d.num_heads // d.num_kv_heads
        scale = d.head_dim**-0.5

        cos, sin = self._rope(positions)
        cos, sin = cos[:, None, :], sin[:, None, :]
        write_page, write_offset = slots // page_size, slots % page_size

        span = int(kv_lens.max())
        cols = torch.arange(span, dtype=torch.int64)
        valid = cols[None, :] < kv_lens[:, None]  # [N, span]
        read_page = torch.where(valid, tables[:, cols // page_size], 0)  # [N, span]
        read_offset = (cols % page_size).expand(n, span)
        masked = ~valid[:, None, None, :]  # [N, 1, 1, span]

        x = w.embed_tokens[tokens]  # [N, hidden]
        for layer, k_cache, v_cache in zip(w.layers, self.k_cache, self.v_cache, strict=True):
            h = _rms_norm(x, layer.input_layernorm, d.rms_norm_eps)
            q = _rms_norm(
                (h @ layer.q_proj.T).view(n, d.num_heads, d.head_dim), layer.q_norm, d.rms_norm_eps
            )
            k = _rms_norm(
                (h @ layer.k_proj.T).view(n, d.num_kv_heads, d.head_dim),
                layer.k_norm,
                d.rms_norm_eps,
            )
            v = (h @ layer.v_proj.T).view(n, d.num_kv_heads, d.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin

            k_cache[write_page, write_offset] = k
            v_cache[write_page, write_offset] = v
            keys = k_cache[read_page, read_offset]  # [N, span, kv_heads, head_dim]
            values = v_cache[read_page, read_offset]

            qg = q.view(n, d.num_kv_heads, groups, d.head_dim)
            scores = torch.einsum("nkgd,nskd->nkgs", qg, keys) * scale
            scores = scores.masked_fill(masked, float("-inf"))
            probs = torch.softmax(scores.to(torch.float32), dim=-1).to(self.dtype)
            attn = torch.einsum("nkgs,nskd->nkgd", probs, values).reshape(n, -1)
            x = x + attn @ layer.o_proj.T

            h = _rms_norm(x, layer.post_attention_layernorm, d.rms_norm_eps)
            gate = torch.nn.functional.silu(h @ layer.gate_proj.T)
            x = x + (gate * (h @ layer.up_proj.T)) @ layer.down_proj.T

        x = _rms_norm(x, w.norm, d.rms_norm_eps)
        return (x @ w.lm_head.T).to(torch.float32)
