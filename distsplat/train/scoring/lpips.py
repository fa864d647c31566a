"""LPIPS (Zhang et al. 2018) as gsplat's simple_trainer reports it (torchmetrics'
LearnedPerceptualImagePatchSimilarity, net_type "alex" or "vgg", normalize=True: inputs in
[0, 1]), built in plain torch so that it needs neither torchvision nor a download.

The network: ImageNet-trained AlexNet or VGG16 feature layers (torchvision's layout, so
torchvision's checkpoint files load as they are), cut after five ReLUs; each cut's
features are unit-normalised over channels, their squared difference weighted by a
1x1 "linear head" (the lpips package's v0.1 weights, shipped by both `lpips` and
`torchmetrics`), averaged over the pixels and summed over the five cuts.

Weights are looked up where they usually are: the backbone in torch hub's cache
(`torch.hub.get_dir()/checkpoints`, where torchvision saves it) or --lpips_weights; the heads
in an installed `torchmetrics` or `lpips` package, torch hub's cache, or --lpips_heads.
`load_lpips` returns None and the reason when one is missing. Where the machine is online,
`fetch_weights` downloads what is missing once, from where torchvision and lpips publish it,
into torch hub's cache under torchvision's file name (so torchvision and torchmetrics find it
too), checked against its SHA-256 and bounded in time; offline it fails in seconds with a
reason and LPIPS is skipped. DISTSPLAT_NO_DOWNLOAD=1 turns downloads off (the tests do).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple
from urllib.error import HTTPError, URLError
from urllib.parse import urlparse
from urllib.request import Request, urlopen

import torch
from torch import Tensor, nn

from ...distributed import DistContext, all_reduce_max, barrier

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

# Where they are published: torchvision's URLs (torchvision.models.AlexNet_Weights / VGG16_Weights)
# and lpips' repository. The backbones' SHA-256 prefixes are in their names (torch hub's
# check_hash convention); the heads' are those of the lpips 0.1.4 wheel and torchmetrics 1.9
# (the same bytes), and their cache names carry it likewise.
BACKBONE_URLS = {"alex": "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
                 "vgg": "https://download.pytorch.org/models/vgg16-397923af.pth"}
BACKBONE_SHA256 = {"alex": "7be5be79", "vgg": "397923af"}
HEAD_URL = "https://raw.githubusercontent.com/richzhang/PerceptualSimilarity/master/lpips/weights/v0.1/{net}.pth"
HEAD_SHA256 = {"alex": "df73285e35b22355a2df87cdb6b70b343713b667eddbda73e1977e0c860835c0",
               "vgg": "a78928a0af1e5f0fcb1f3b9e8f8c3a2a5a3de244d830ad5c1feddc79b8432868"}
HEAD_CACHE = "lpips_v0.1_{net}-{sha}.pth"  # in torch hub's checkpoints folder, sha: 8 hex digits
NO_DOWNLOAD_ENV = "DISTSPLAT_NO_DOWNLOAD"  # "1": never download (offline clusters, the tests)
# An offline machine fails at the connection (DNS or refused) at once, a black-holed one
# after FETCH_TIMEOUT_S; a slow link gives up after FETCH_DEADLINE_S (AlexNet is 233 MB, VGG16
# 528 MB), well inside the 600 s collective timeout the node's other ranks wait under.
FETCH_TIMEOUT_S = 10.0
FETCH_DEADLINE_S = 240.0


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


def hub_dir() -> Path:
    """torch hub's checkpoints folder ($TORCH_HOME/hub/checkpoints), where torchvision caches."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def head_cache(net: str) -> Path:
    return hub_dir() / HEAD_CACHE.format(net=net, sha=HEAD_SHA256[net][:8])


def downloads_off() -> bool:
    return os.environ.get(NO_DOWNLOAD_ENV, "") == "1"


def find_weights(net: str, weights: Optional[str] = None, heads: Optional[str] = None
                 ) -> Tuple[Optional[Path], Optional[Path], List[str]]:
    """(backbone file, heads file, the places looked at when one was not found)."""
    looked: List[str] = []
    if weights is not None:
        backbone: Optional[Path] = Path(weights) if Path(weights).is_file() else None
        looked += [] if backbone else [f"--lpips_weights {weights}"]
    else:
        cand = hub_dir() / BACKBONE_FILES[net]
        backbone = cand if cand.is_file() else None
        looked += [] if backbone else [str(cand)]
    if heads is not None:
        head: Optional[Path] = Path(heads) if Path(heads).is_file() else None
        looked += [] if head else [f"--lpips_heads {heads}"]
    else:
        head = None
        roots = [_package_dir(pkg) for pkg in HEAD_FILES]
        for cand in [r / rel.format(net=net) for r, rel in zip(roots, HEAD_FILES.values()) if r is not None] + [
                head_cache(net)]:
            if cand.is_file():
                head = cand
                break
        looked += [] if head else [f"an installed torchmetrics or lpips package, {head_cache(net)}"]
    return backbone, head, looked


def fetch(url: str, dst: Path, sha256: str, timeout_s: float = FETCH_TIMEOUT_S,
          deadline_s: float = FETCH_DEADLINE_S, on_start: Optional[Callable[[Optional[int]], None]] = None) -> None:
    """Downloads `url` to `dst` as torch.hub.download_url_to_file does (into a .partial file
    beside it, moved into place only once its SHA-256 starts with `sha256`, so a broken
    download never leaves a file that looks cached), but bounded: `timeout_s` for the
    connection and each read, `deadline_s` for the whole file. `on_start(bytes or None)` runs
    once the server answered. Raises OSError (URLError, TimeoutError) or ValueError (hash)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{dst.name}.{uuid.uuid4().hex}.partial")
    start = time.monotonic()
    try:
        with urlopen(Request(url, headers={"User-Agent": "torch.hub"}), timeout=timeout_s) as u, \
                open(tmp, "wb") as f:
            size = u.headers.get("Content-Length")
            if on_start is not None:
                on_start(int(size) if size and size.isdigit() else None)
            digest = hashlib.sha256()
            read = getattr(u, "read1", u.read)  # what has arrived: a trickle cannot outlast the deadline
            while True:
                chunk = read(1 << 20)
                if not chunk:
                    break
                f.write(chunk)
                digest.update(chunk)
                if time.monotonic() - start > deadline_s:
                    raise TimeoutError(f"not done after {deadline_s:g} s")
        got = digest.hexdigest()
        if not got.startswith(sha256):
            raise ValueError(f"its SHA-256 {got[:16]}... is not {sha256[:16]}...")
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _why(e: BaseException) -> str:
    """A failed download's reason in a few words: URLError's own reason, not its repr."""
    if isinstance(e, URLError) and not isinstance(e, HTTPError):
        e = e.reason if isinstance(e.reason, BaseException) else OSError(str(e.reason))
    text = str(e).strip() or type(e).__name__
    return f"{type(e).__name__}: {text}"[:120]


def fetch_weights(net: str, weights: Optional[str] = None, heads: Optional[str] = None,
                  min_side: Optional[int] = None, say: Optional[Callable[..., None]] = None,
                  timeout_s: float = FETCH_TIMEOUT_S, deadline_s: float = FETCH_DEADLINE_S) -> Optional[str]:
    """Downloads the backbone and heads that find_weights does not find in the usual places
    (never those named by --lpips_weights / --lpips_heads) into torch hub's cache. Returns
    None when nothing was missing, downloads are off, the images are too small for LPIPS, or
    every download worked; else the note why LPIPS is skipped. Never raises: a failed
    download skips LPIPS, it never fails a run. `say` logs the start of a download."""
    if downloads_off() or (min_side is not None and min_side < MIN_SIDE[net]):
        return None
    backbone, head, _ = find_weights(net, weights, heads)
    todo = []  # the heads (kB) first: where their host is unreachable, the backbone (MB) is not fetched in vain
    if head is None and heads is None:
        todo.append((HEAD_URL.format(net=net), head_cache(net), HEAD_SHA256[net]))
    if backbone is None and weights is None:
        todo.append((BACKBONE_URLS[net], hub_dir() / BACKBONE_FILES[net], BACKBONE_SHA256[net]))
    for url, dst, sha in todo:
        def started(size: Optional[int], url: str = url, dst: Path = dst) -> None:
            if say is not None:
                shown = "" if not size else f" ({size / 1e6:.0f} MB)" if size >= 1e6 else f" ({size / 1e3:.0f} kB)"
                say("LPIPS %s: downloading %s%s into %s (once)", net, url, shown, dst.parent)
        try:
            fetch(url, dst, sha, timeout_s, deadline_s, started)
        except Exception as e:  # noqa: BLE001 - offline, a proxy, a full disk: LPIPS is skipped, the run goes on
            return (f"LPIPS skipped: could not download {Path(urlparse(url).path).name} from {urlparse(url).netloc} "
                    f"({_why(e)}); " + _advice(net))
    return None


def _advice(net: str) -> str:
    return (f"pass --lpips_weights (torchvision's {BACKBONE_FILES[net]}) and --lpips_heads (lpips' v0.1/{net}.pth, "
            f"or pip install torchmetrics), or copy them into torch hub's checkpoints folder {hub_dir()}")


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
        off = f" (downloads are off: {NO_DOWNLOAD_ENV}=1)" if downloads_off() else ""
        return None, f"LPIPS skipped: no {net} {what} weights{off} in {', '.join(looked)}; " + _advice(net)
    try:
        model = LPIPS(net).load(torch.load(backbone, map_location="cpu", weights_only=True),
                                torch.load(head, map_location="cpu", weights_only=True))
    except (RuntimeError, KeyError, OSError) as e:
        raise ValueError(f"LPIPS {net}: {backbone} and {head} are not the {net} backbone and lpips heads "
                         f"({type(e).__name__}: {str(e)[:200]}); pass the right files with --lpips_weights "
                         "/ --lpips_heads, or --lpips_net") from None
    return model.to(device), f"LPIPS {net}: backbone {backbone}, heads {head}"


def ready_lpips(ctx: DistContext, net: str, weights: Optional[str], heads: Optional[str], device: torch.device,
                min_side: int, model: Optional[LPIPS], note: str, say: Callable[..., None]
                ) -> Tuple[Optional[LPIPS], str]:
    """After setup (model, note: its load_lpips), every rank calls it: weights missing from the
    usual places are downloaded by each node's local rank 0 while the node's other ranks wait
    (fetch_weights: bounded in time; a failure skips LPIPS), then every rank agrees whether
    LPIPS is computed (one rank scoring without it would skew the mean). Two collectives, once
    per run. Returns (the network or None on every rank, the note to log or keep)."""
    failed = None
    if model is None and ctx.local_rank == 0:
        failed = fetch_weights(net, weights, heads, min_side, say if ctx.is_main else None)
    barrier()  # the node's download is in its cache before its other ranks look
    if model is None:
        try:
            model, note = load_lpips(net, weights, heads, device, min_side=min_side)
        except Exception as e:  # noqa: BLE001 - every rank must reach the agreement; a bad file skips LPIPS
            model, note = None, f"LPIPS skipped: {type(e).__name__}: {e}"
        if model is None and failed is not None:
            note = failed
    missing = all_reduce_max(torch.tensor([float(model is None)], device=device)).item()
    if missing and model is not None:
        model, note = None, ("LPIPS skipped: another rank found no weights; pass --lpips_weights and "
                             "--lpips_heads files that every node can read")
    return model, note


def short_lpips_note(note: str) -> str:
    """The log's line for a skipped LPIPS: `note`'s first clause (what is missing), pointing
    to the JSON, which keeps the whole advice (issue 32: a 400-character line per run)."""
    head = note.split("; ", 1)[0]
    if len(head) > 160:
        head = head[:157] + "..."
    return f"{head} (what to pass: lpips_skipped in stats/val_stepNNNN.json, or --help)"
