"""Temperature scaling for dynamic-tree values (`specdec.training.calibration`) and the zoo's
fitted temperatures reaching the drafters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specdec
from specdec import zoo
from specdec.drafters.tree_search.dynamic import DynamicTree, grow_tree
from specdec.training.calibration import GRID, calibration_losses, fit_temperature


def _sampled_labels(logits: torch.Tensor, seed: int) -> torch.Tensor:
    """Teacher log-probabilities [N, V] one-hot at labels drawn from softmax(logits)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
    return torch.full_like(logits, -30.0).scatter(-1, labels[:, None], 0.0)


@pytest.mark.parametrize("scale", [0.25, 1.0, 3.0])
def test_fit_recovers_the_temperature_that_generated_the_labels(scale: float):
    generator = torch.Generator().manual_seed(1)
    true_logits = torch.randn(6000, 12, generator=generator, dtype=torch.float64) * 2
    teacher = _sampled_labels(true_logits, seed=2)
    # the drafter reports its logits `scale` times too flat: the fitted temperature undoes it
    tau = fit_temperature(calibration_losses(true_logits / scale, teacher))
    assert tau == pytest.approx(1 / scale, rel=0.15)


def test_calibration_losses_are_the_mean_free_nll_at_each_temperature():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    teacher = torch.tensor([[0.0, -9.0, -9.0], [-9.0, -9.0, 0.0]])  # argmax 0, then 2
    losses = calibration_losses(logits, teacher)
    for i in (0, len(GRID) // 2, len(GRID) - 1):
        log_probs = torch.log_softmax(logits / GRID[i], -1)
        assert losses[i].item() == pytest.approx(-(log_probs[0, 0] + log_probs[1, 2]).item(), rel=1e-6)


def test_value_temperature_never_changes_the_candidates_only_which_are_kept():
    generator = torch.Generator().manual_seed(3)
    table = torch.randn(50, 40, generator=generator)  # next-token logits by last token

    def expand(search, nodes):
        return table[torch.tensor([search.tokens[n] for n in nodes])]

    root = table[7]
    sharp, _ = grow_tree(root, expand, DynamicTree(top_k=3, total_tokens=9, value_temperature=0.2), 4,
                         torch.device("cpu"))
    flat, _ = grow_tree(root, expand, DynamicTree(top_k=3, total_tokens=9), 4, torch.device("cpu"))
    top3 = set(root.topk(3).indices.tolist())
    for draft in (sharp, flat):  # candidates are the top-k under their parent either way
        first = [t for t, parent in zip(draft.tokens.tolist(), draft.parents.tolist()) if parent < 0]
        assert set(first) <= top3 and first
    depth = lambda draft: max(_depths(draft.parents.tolist()))  # noqa: E731
    assert depth(sharp) > depth(flat)  # sharper values reach deeper with the same node budget


def _depths(parents: list[int]) -> list[int]:
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "0.3", True])
def test_bad_value_temperatures_are_refused_naming_the_drafter(quick_zoo: Path, value: object):
    options = zoo.drafter_options(quick_zoo)["eagle"]
    with pytest.raises(ValueError, match=r"eagle: value_temperature must be a finite number > 0"):
        specdec.make_drafter("eagle", **{**options, "value_temperature": value, "tree": True})


def test_the_zoo_fits_a_value_temperature_per_learned_drafter_and_passes_it_on(quick_zoo: Path):
    fitted = json.loads((quick_zoo / "value_temperatures.json").read_text())
    assert set(fitted) == {"draft-model", "eagle", "eagle3", "mtp"}
    assert all(GRID[0] <= tau <= GRID[-1] for tau in fitted.values())
    manifest = zoo.manifest(quick_zoo)
    options = zoo.drafter_options(quick_zoo)
    for name, tau in fitted.items():
        assert manifest["pieces"][name]["value_temperature"] == tau
        assert options[name]["value_temperature"] == tau
        assert specdec.make_drafter(name, **options[name], tree=True).tree.value_temperature == tau
    # small distilled drafters are under-confident: their fitted temperature sharpens them
    assert fitted["eagle"] < 1.0
