"""LPIPS (Zhang et al. 2018) as gsplat's simple_trainer reports it (torchmetrics'
LearnedPerceptualImagePatchSimilarity, net_type "alex" or "vgg", normalize=True: inputs in
[0, 1]), built in plain torch so that it needs neither torchvision nor a download.

The network: ImageNet-trained AlexNet or VGG16 feature layers (torchvision's layout, so
torchvision's checkpoint files load as they are), cut after five ReLUs; each cut's
features are unit-normalised over channels, their squared difference weighted by a
1x1 "linear head" (the lpips package's v0.1 weights, shipped by both `lpips` and
`torchmetrics`), averaged over the pixels and summed over the five cuts.

Weights are looked up where they usually are and never downloaded (training machines
may have no internet): the backbone in torch hub's cache (`torch.hub.get_dir()/checkpoints`,
where torchvision saves it) or --lpips_weights; the heads in an installed `torchmetrics` or
`lpips` package or --lpips_heads. `load_lpips` returns None and the reason when one is missing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

# torchvision's checkpoint file names (what torchvision.models.alexnet(weights=DEFAULT) caches).
BACKBONE_FILES = {"alex": "alexnet-owt-7be5be79.pth", "vgg": "vgg16-397923af.pth"}
CHANNELS = {"alex": [64, 192, 384, 256, 256], "vgg": [64, 128, 256, 512, 512]}
# Index of the layer after each cut in torchvision's `features` Sequential (each cut ends on a ReLU).
CUTS = {"alex": [2, 5, 8, 10, 12], "vgg": [4, 9, 16, 23, 30]}
# The smallest image side whose features survive to the fifth cut (AlexNet: stride 4 and two
# 3x3/2 poolings; VGG: four 2x2 poolings).
MIN_SIDE = {"alex": 31, "vgg": 16}
# Where each package keeps the heads, relative to the package folder.
HEAD_FILES = {"torchmetrics": "functional/image/lpips_models/{net}.pth", "lpips": "weights/v0.1/{net}.pth"}


def backbone_layers(net: str) -> nn.Sequential:
    """torchvision's `alexnet().features` / `vgg16().features`, same indices, same keys."""
    if net == "alex":
        return nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2),
        )
    if net == "vgg":
        layers: List[nn.Module] = []
        c_in = 3
        for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c_in, int(v), 3, padding=1), nn.ReLU()]
                c_in = int(v)
        return nn.Sequential(*layers)
    raise ValueError(f"--lpips_net must be alex or vgg, got {net!r}")


class LPIPS(nn.Module):
    """lpips(a, b) for [B, H, W, 3] images in [0, 1] -> [B] distances (0: identical)."""

    # lpips' ScalingLayer: the inputs in [-1, 1] shifted and scaled to ImageNet's statistics.
    SHIFT = (-0.030, -0.088, -0.188)
    SCALE = (0.458, 0.448, 0.450)

    def __init__(self, net: str = "alex"):
        super().__init__()
        self.net = net
        self.features = backbone_layers(net)
        self.lins = nn.ModuleList(nn.Conv2d(c, 1, 1, bias=False) for c in CHANNELS[net])
        self.register_buffer("shift", torch.tensor(self.SHIFT).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor(self.SCALE).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False)
        self.eval()

    def load(self, backbone: Dict[str, Tensor], heads: Dict[str, Tensor]) -> "LPIPS":
        """backbone: torchvision's state dict (features.* used, the classifier ignored);
        heads: lpips' state dict (lin{k}.model.1.weight). Missing or misshapen keys raise."""
        feats = {k[len("features."):]: v for k, v in backbone.items() if k.startswith("features.")}
        self.features.load_state_dict(feats)
        self.lins.load_state_dict({f"{k}.weight": heads[f"lin{k}.model.1.weight"] for k in range(len(self.lins))})
        return self

    def _cuts(self, x: Tensor) -> List[Tensor]:
        out, start = [], 0
        for end in CUTS[self.net]:
            for layer in self.features[start:end]:
                x = layer(x)
            out.append(x)
            start = end
        return out

    @torch.no_grad()
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        # [B, H, W, 3] in [0, 1] -> [B, 3, H, W] in [-1, 1] (torchmetrics' normalize=True)
        x = [((2 * t.permute(0, 3, 1, 2).float() - 1) - self.shift) / self.scale for t in (a, b)]
        fa, fb = self._cuts(x[0]), self._cuts(x[1])
        total = torch.zeros(a.shape[0], device=a.device)
        for lin, u, v in zip(self.lins, fa, fb):
            u = u / torch.sqrt(1e-8 + (u * u).sum(1, keepdim=True))  # torchmetrics' eps
            v = v / torch.sqrt(1e-8 + (v * v).sum(1, keepdim=True))
            total = total + lin((u - v) ** 2).mean((1, 2, 3))
        return total


def _package_dir(name: str) -> Optional[Path]:
    """The folder of an installed package, found without importing it (lpips imports torchvision)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_weights(net: str, weights: Optional[str] = None, heads: Optional[str] = None
                 ) -> Tuple[Optional[Path], Optional[Path], List[str]]:
    """(backbone file, heads file, the places looked at when one was not found)."""
    looked: List[str] = []
    if weights is not None:
        backbone: Optional[Path] = Path(weights) if Path(weights).is_file() else None
        looked += [] if backbone else [f"--lpips_weights {weights}"]
    else:
        cand = Path(torch.hub.get_dir()) / "checkpoints" / BACKBONE_FILES[net]
        backbone = cand if cand.is_file() else None
        looked += [] if backbone else [str(cand)]
    if heads is not None:
        head: Optional[Path] = Path(heads) if Path(heads).is_file() else None
        looked += [] if head else [f"--lpips_heads {heads}"]
    else:
        head = None
        for pkg, rel in HEAD_FILES.items():
            root = _package_dir(pkg)
            cand = root / rel.format(net=net) if root is not None else None
            if cand is not None and cand.is_file():
                head = cand
                break
        looked += [] if head else ["an installed torchmetrics or lpips package"]
    return backbone, head, looked


def load_lpips(net: str = "alex", weights: Optional[str] = None, heads: Optional[str] = None,
               device: torch.device = torch.device("cpu"), min_side: Optional[int] = None
               ) -> Tuple[Optional[LPIPS], str]:
    """(the network, where its weights came from) or (None, why LPIPS is skipped: no weights,
    or images whose smaller side `min_side` is too small for the network). A file that is
    there but unreadable or of the wrong network raises ValueError naming it."""
    if min_side is not None and min_side < MIN_SIDE[net]:
        return None, (f"LPIPS skipped: the images' smaller side ({min_side} px) is below the {MIN_SIDE[net]} px "
                      f"that LPIPS {net} needs" + ("; --lpips_net vgg needs 16" if net == "alex" else ""))
    for flag, path in (("--lpips_weights", weights), ("--lpips_heads", heads)):
        if path is not None and not Path(path).is_file():  # asked for by name: an error, not a skip
            raise ValueError(f"{flag} {path}: no such file; pass the {net} weights file, or leave the flag out "
                             "to look in the usual places (LPIPS is skipped when they are not there)")
    backbone, head, looked = find_weights(net, weights, heads)
    if backbone is None or head is None:
        what = "backbone" if backbone is None else "linear heads"
        return None, (f"LPIPS skipped: no {net} {what} weights in {', '.join(looked)}; pass --lpips_weights "
                      f"(torchvision's {BACKBONE_FILES[net]}) and --lpips_heads (lpips' v0.1/{net}.pth, or "
                      "pip install torchmetrics), or copy the backbone into torch hub's checkpoints folder")
    try:
        model = LPIPS(net).load(torch.load(backbone, map_location="cpu", weights_only=True),
                                torch.load(head, map_location="cpu", weights_only=True))
    except (RuntimeError, KeyError, OSError) as e:
        raise ValueError(f"LPIPS {net}: {backbone} and {head} are not the {net} backbone and lpips heads "
                         f"({type(e).__name__}: {str(e)[:200]}); pass the right files with --lpips_weights "
                         "/ --lpips_heads, or --lpips_net") from None
    return model.to(device), f"LPIPS {net}: backbone {backbone}, heads {head}"


def short_lpips_note(note: str) -> str:
    """The log's line for a skipped LPIPS: `note`'s first clause (what is missing), pointing
    to the JSON, which keeps the whole advice (issue 32: a 400-character line per run)."""
    head = note.split("; ", 1)[0]
    if len(head) > 160:
        head = head[:157] + "..."
    return f"{head} (what to pass: lpips_skipped in stats/val_stepNNNN.json, or --help)"
