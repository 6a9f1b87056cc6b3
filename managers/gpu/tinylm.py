"""A tiny causal transformer LM built from a config with random weights (the model needs torch).

What the `torch` backend serves in tests and benchmarks: nothing is downloaded, the weights are
seeded, and the forward pass answers what a teacher or reward service answers in agentic RL,
the log-probability of each given token after its prefix.

torch is optional (the gpu extra): the config and its sizes need none, and the model classes
(`TinyLM`, `Block`) are built on first access, so importing this module never imports torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# bytes per element of the dtypes a config may name (torch's `element_size`)
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


@dataclass(frozen=True, slots=True)
class TinyLMConfig:
    vocab: int = 256
    dim: int = 64
    layers: int = 2
    heads: int = 4
    max_len: int = 128
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"tinylm.dim: {self.dim} is not divisible by heads={self.heads}")

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch  # optional third-party dependency, on first use

        return getattr(torch, self.dtype)

    def param_count(self) -> int:
        d = self.dim
        block = 2 * 2 * d + d * 3 * d + 3 * d + d * d + d + d * 4 * d + 4 * d + 4 * d * d + d
        return self.vocab * d + self.max_len * d + self.layers * block + 2 * d

    def nbytes(self) -> int:
        size = DTYPE_BYTES.get(self.dtype)
        if size is None:  # a dtype outside the table: ask torch (raises if it has none such)
            import torch  # optional third-party dependency, on first use

            size = torch.empty((), dtype=self.torch_dtype).element_size()
        return self.param_count() * size

    @classmethod
    def of_size(cls, nbytes: int, dim: int = 1024, dtype: str = "float32") -> TinyLMConfig:
        """About `nbytes` of weights: the layer count that gets closest at this width."""
        base = cls(vocab=256, dim=dim, layers=0, heads=8, dtype=dtype)
        per_layer = cls(vocab=256, dim=dim, layers=1, heads=8, dtype=dtype).nbytes() - base.nbytes()
        layers = max(1, round((nbytes - base.nbytes()) / per_layer))
        return cls(vocab=256, dim=dim, layers=layers, heads=8, dtype=dtype)


def __getattr__(name: str) -> Any:
    if name in ("TinyLM", "Block"):
        return _model_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _model_classes() -> dict[str, type]:
    """The torch modules, defined once on first use (torch is imported here, not above)."""
    import torch  # optional third-party dependency (the gpu extra)
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.up = nn.Linear(dim, 4 * dim)
            self.down = nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            att = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class TinyLM(nn.Module):
        def __init__(self, cfg: TinyLMConfig) -> None:
            super().__init__()
            self.cfg = cfg
            gen = torch.Generator().manual_seed(cfg.seed)
            self.tok = nn.Embedding(cfg.vocab, cfg.dim)
            self.pos = nn.Embedding(cfg.max_len, cfg.dim)
            self.blocks = nn.ModuleList(Block(cfg.dim, cfg.heads) for _ in range(cfg.layers))
            self.ln = nn.LayerNorm(cfg.dim)
            with torch.no_grad():  # every weight from the seed alone: equal configs, equal models
                for m in self.modules():
                    if isinstance(m, nn.Linear):
                        m.bias.zero_()
                for p in self.parameters():
                    if p.dim() > 1:
                        p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            self.to(cfg.torch_dtype)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            """Log-prob of tokens[:, 1:] given their prefixes, shape (batch, len - 1)."""
            t = tokens.shape[1]
            if t > self.cfg.max_len:
                raise ValueError(f"tokens: length {t} exceeds max_len {self.cfg.max_len}")
            pos = torch.arange(t, device=tokens.device)
            x = self.tok(tokens) + self.pos(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln(x) @ self.tok.weight.T  # tied output head
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            return logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)

    for cls in (TinyLM, Block):
        cls.__qualname__ = cls.__name__
    return {"TinyLM": TinyLM, "Block": Block}
