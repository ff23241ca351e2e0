"""Full-size parts of NeMo's diffusion models that more than one benchmark builds (weights random or none)."""

from __future__ import annotations

from typing import Any


def clip_vit_l_text(positions: int = 77) -> Any:
    """CLIP ViT-L/14's text tower as openai/clip-vit-large-patch14's config.json gives it: 12 layers,
    width 768 (what NeMo's FrozenCLIPEmbedder loads), `positions` tokens."""
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(
        CLIPTextConfig(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            max_position_embeddings=positions,
        )
    )
