"""Many-class models for benchmarks/bench_prune.py: Fashion-MNIST composites.

k Fashion-MNIST images side by side ([1, 28, 28 k]) labelled by their classes read as a k-digit
number in base 10: k = 2 gives C = 100 classes, k = 3 gives C = 1,000. probust's CNN is trained
on them briefly (probust.training.train; SGD, a few thousand composites) on the CPU: accuracy
matters less than realistic many-class margins. Models are cached under runs/bench_prune/.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import probust.data
from probust.data import ImageDataset
from probust.training import train

RUNS = Path("runs/bench_prune")
FASHION = "/usr/share/datasets/fashion-mnist"


def composites(split: str, parts: int, n: int, seed: int) -> ImageDataset:
    """``n`` composites of ``parts`` images of one Fashion-MNIST split (uint8, label in base 10)."""
    source = probust.data.load("fashion-mnist", split, root=FASHION)
    images, labels = source.tensors()
    images = (images * 255).round().to(torch.uint8)
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(labels), (n, parts), generator=gen)
    x = torch.cat([images[pick[:, j]] for j in range(parts)], dim=3)
    y = sum(labels[pick[:, j]] * 10 ** (parts - 1 - j) for j in range(parts))
    return ImageDataset(
        x,
        torch.as_tensor(y),
        name=f"fashion-mnist-x{parts}",
        split=split,
        classes=[str(c) for c in range(10**parts)],
        mean=source.mean,
        std=source.std,
        source=FASHION,
    )


def model(parts: int, *, epochs: int = 2, n_train: int = 30_000) -> tuple[nn.Module, ImageDataset]:
    """(the trained CNN, its test composites) for C = 10 ** parts classes."""
    test = composites("test", parts, 2_000, seed=1)
    out = RUNS / f"cnn_x{parts}.pt"
    result = train(
        composites("train", parts, n_train, seed=0),
        "cnn",
        test_dataset=test,
        out=out,
        epochs=epochs,
        lr=0.05,
        batch_size=128,
        show_progress=False,
        num_threads=1,
    )
    return result.model.eval(), test


if __name__ == "__main__":
    for parts in (2, 3):
        m, test = model(parts)
        x, y = test.tensors()
        with torch.no_grad():
            acc = (m(x[:1000]).argmax(1) == y[:1000]).float().mean().item()
        print(f"C = {10**parts}: test accuracy {acc:.3f}")
