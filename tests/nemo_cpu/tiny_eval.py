"""Stand-ins for the evaluation's pretrained networks, which cannot be downloaded here (no internet):
FID's Inception with RANDOM weights (torch-fidelity's architecture, saved as the real weights file is),
and a tiny whole CLIP model (text and image towers) saved like openai/clip-vit-large-patch14.

    <nemo python> tests/nemo_cpu/tiny_eval.py inception PATH
    <nemo python> tests/nemo_cpu/tiny_eval.py clip FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def write_inception(path: Path) -> None:
    """torch-fidelity's FeatureExtractorInceptionV3, randomly initialised, as a plain state dict."""
    import torch
    import torch_fidelity.feature_extractor_inceptionv3 as fidelity

    # Build the network without the real weights: nothing to load, nothing to download.
    fidelity.load_state_dict_from_url = lambda *_a, **_k: {}
    fidelity.FeatureExtractorInceptionV3.load_state_dict = lambda *_a, **_k: None  # type: ignore[method-assign]
    torch.manual_seed(0)
    network = fidelity.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    # He initialisation keeps the activations' scale through the 90-odd ReLU layers (PyTorch's default
    # shrinks them to ~1e-8 by the last one: every image would get the same features).
    for module in network.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(network.state_dict(), path)


def write_clip(folder: Path) -> None:
    """A 2-layer CLIP (both towers, 32 px images) with tiny.py's tokenizer and CLIP's image preprocessing."""
    import torch
    from tiny import _SPECIAL, WIDTH, _byte_vocab
    from tiny import write_clip as write_text_clip
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    write_text_clip(folder)  # the tokenizer files (and a text model, replaced below)
    vocab = _byte_vocab()
    text = {
        "vocab_size": len(vocab),
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
        "bos_token_id": vocab[_SPECIAL[0]],
        "eos_token_id": vocab[_SPECIAL[1]],
    }
    vision = {
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=WIDTH)).save_pretrained(
        folder
    )
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        folder
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    {"inception": write_inception, "clip": write_clip}[sys.argv[1]](Path(sys.argv[2]))
