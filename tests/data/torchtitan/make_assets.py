"""``python tests/data/torchtitan/make_assets.py DIR``: what torchtitan's debug configurations read.

A small synthetic word-level tokenizer (``DIR/tests/assets/tokenizer``) and a few hundred JSON
lines of text (``DIR/tests/assets/c4_test/data.json``); torchtitan reads both relative to the
directory it runs in. Its wheel ships neither (its repository's are real data); these are made
from a fixed seed."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = 1000
"""Distinct words: the tokenizer's vocabulary (plus three special tokens) stays within the debug
model's 2,048 embeddings."""


def write_assets(root: Path, *, documents: int = 400, seed: int = 0) -> Path:
    """Write ``root/tests/assets/{tokenizer,c4_test}`` and return ``root``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    assets = root / "tests" / "assets"
    words = [f"w{i}" for i in range(WORDS)]
    special = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    vocab = {token: i for i, token in enumerate(special + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (assets / "tokenizer").mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(assets / "tokenizer" / "tokenizer.json"))
    config = {"bos_token": special[1], "eos_token": special[2], "add_bos_token": True, "add_eos_token": True}
    (assets / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config))
    rng = random.Random(seed)
    (assets / "c4_test").mkdir(parents=True, exist_ok=True)
    with open(assets / "c4_test" / "data.json", "w") as f:
        for _ in range(documents):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(50, 400)))
            f.write(json.dumps({"text": text}) + "\n")
    return root


if __name__ == "__main__":
    import sys

    print(f"wrote {write_assets(Path(sys.argv[1] if len(sys.argv) > 1 else '.')) / 'tests' / 'assets'}")
