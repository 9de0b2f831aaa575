"""Vision Transformer through Hugging Face ``transformers`` (optional: ``pip install 'probust[hf]'``).

Two ways to build one:

* ``pretrained="google/vit-base-patch16-224-in21k"`` (a hub name or a local folder): the paper's
  set-up, a pretrained ViT whose classification head is replaced for ``num_classes``. Inputs are
  resized inside the model to the checkpoint's image size and normalised with its processor's
  statistics.
* no ``pretrained``: a small ViT built from a config, offline. ``config`` overrides any field of
  the default small config.

Either way the model records the full resolved config, so a probust checkpoint rebuilds it with
no network access.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from probust.models._layers import Normalize

#: A small ViT for 28x28 / 32x32 inputs (0.55M parameters at 3x32x32, patch 4), trainable on a CPU.
SMALL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}

#: The ViTConfig fields that define the architecture (what a checkpoint records).
_VIT_ARCH_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "initializer_range",
    "layer_norm_eps",
    "image_size",
    "patch_size",
    "num_channels",
    "qkv_bias",
    "encoder_stride",
    "pooler_output_size",
    "pooler_act",
)


def _transformers():
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("the 'vit' architecture needs Hugging Face transformers: pip install 'probust[hf]'") from exc
    return transformers


def _default_patch(h: int, w: int) -> int:
    return next(p for p in (4, 2, 1) if h % p == 0 and w % p == 0)


class ViTClassifier(nn.Module):
    """A ``transformers`` ViT behind probust's calling convention.

    Maps ``[B, *input_shape]`` float32 in [0, 1] to logits ``[B, num_classes]``: repeat a grey
    channel if the ViT expects colour, normalise, resize (bilinear) to the ViT's image size.

    Args:
        num_classes: number of output logits.
        input_shape: ``(C, H, W)`` of the inputs the model will be given.
        pretrained: hub name or local folder of a pretrained ViT to fine-tune; None to build
            from ``config``.
        config: ViTConfig fields overriding the defaults (the small config, or the checkpoint's).
        mean, std: input normalisation; default the pretrained processor's, else none.
    """

    arch = "vit"

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: Sequence[int] = (3, 32, 32),
        pretrained: str | None = None,
        config: Mapping[str, Any] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        tf = _transformers()
        c, h, w = input_shape
        overrides = dict(config or {})
        # Eager attention: double backprop (gradient-norm regularisation) and torch.func
        # transforms work through it on every device.
        overrides.setdefault("attn_implementation", "eager")
        if pretrained is not None:
            attn = overrides.pop("attn_implementation")
            self.vit = tf.ViTForImageClassification.from_pretrained(
                pretrained, num_labels=num_classes, ignore_mismatched_sizes=True, attn_implementation=attn, **overrides
            )
            if mean is None or std is None:
                mean, std = self._processor_stats(tf, pretrained, self.vit.config.num_channels)
        else:
            fields = {
                **SMALL_CONFIG,
                "image_size": h,
                "patch_size": _default_patch(h, w),
                "num_channels": c,
                **overrides,
                "num_labels": num_classes,
            }
            self.vit = tf.ViTForImageClassification(tf.ViTConfig(**fields))
        self.input_shape = (c, h, w)
        # Normalised after a grey channel is repeated, so that colour statistics apply.
        self.normalize = Normalize(mean, std, channels=self.vit.config.num_channels)

    @staticmethod
    def _processor_stats(tf: Any, pretrained: str, channels: int) -> tuple[list[float], list[float]]:
        try:
            proc = tf.AutoImageProcessor.from_pretrained(pretrained)
            return list(proc.image_mean), list(proc.image_std)
        except Exception:  # no processor file: the ViT checkpoints' usual statistics
            return [0.5] * channels, [0.5] * channels

    def rebuild_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`probust.models.build` that rebuild this model offline."""
        cfg = self.vit.config.to_dict()
        keep = {k: cfg[k] for k in _VIT_ARCH_FIELDS if k in cfg}
        keep["attn_implementation"] = getattr(self.vit.config, "_attn_implementation", None) or "eager"
        return {
            "config": keep,
            "mean": self.normalize.mean.flatten().tolist(),
            "std": self.normalize.std.flatten().tolist(),
        }

    def forward(self, x: Tensor) -> Tensor:
        cfg = self.vit.config
        if x.shape[1] == 1 and cfg.num_channels != 1:
            x = x.expand(-1, cfg.num_channels, -1, -1)
        x = self.normalize(x)
        if tuple(x.shape[-2:]) != (cfg.image_size, cfg.image_size):
            x = F.interpolate(x, size=(cfg.image_size, cfg.image_size), mode="bilinear", align_corners=False)
        return self.vit(pixel_values=x).logits
