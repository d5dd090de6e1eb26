"""`wizard compare --prices skypilot`: the GPU offers in the price catalogues SkyPilot has already downloaded.

SkyPilot keeps one CSV per cloud, `<runtime dir>/.sky/catalogs/<schema version>/<cloud>/vms.csv` (the runtime dir is
`$SKY_RUNTIME_DIR`, else the home directory: sky/catalog/common.py), refreshed from its hosted catalogue when it uses
a cloud. Each row is an instance type in a region (or zone) with the columns its fetchers write
(sky/catalog/data_fetchers): InstanceType, AcceleratorName, AcceleratorCount, vCPUs, MemoryGiB, Price (on-demand,
per instance-hour, USD), SpotPrice, Region, AvailabilityZone, GpuInfo. The file's date is its modification time:
what SkyPilot itself goes by (it re-downloads a catalogue older than its pull frequency).

Read here with the csv module, offline, without SkyPilot installed (its own reader downloads a missing catalogue
and needs pandas); tests/unit/test_sky_catalog.py holds this reading to SkyPilot's own (list_accelerators_impl) on
the fixture where SkyPilot is installed. Nothing is downloaded: a missing catalogue is one line saying how to get
one. A row without an instance type (GCP's GPUs that attach to a VM chosen apart) prices the GPU alone, not a
machine: it is left out.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path

from wizard.errors import InputError

PRICES_ALLOWED = ("skypilot (on-demand) or skypilot-spot, reading SkyPilot's downloaded catalogues "
                  "(~/.sky/catalogs/; `sky show-gpus` downloads them), or a YAML prices file")
COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region")
MAX_CATALOGUE_BYTES = 64 << 20          # SkyPilot's largest (AWS, every region) is a few MiB


@dataclass(frozen=True)
class Offer:
    """One instance type in one region, as a catalogue lists it."""
    cloud: str
    instance_type: str
    accelerator: str          # SkyPilot's name: "H100", "A100-80GB", "RTX4090"
    count: int                # GPUs per instance
    price: float | None       # USD per instance-hour, on-demand
    spot_price: float | None
    region: str
    zone: str
    memory_gib: float | None  # the instance's host RAM
    date: dt.date             # the catalogue file's date

    def per_gpu_hour(self, spot: bool = False) -> float | None:
        p = self.spot_price if spot else self.price
        return None if p is None else p / self.count

    def where(self) -> str:
        return f"{self.cloud} {self.instance_type} in {self.zone or self.region}"

    def to_json(self, spot: bool = False) -> dict:
        return {"cloud": self.cloud, "instance_type": self.instance_type, "accelerator": self.accelerator,
                "count": self.count, "region": self.region, "zone": self.zone or None,
                "price_per_hour": self.price, "spot_price_per_hour": self.spot_price, "spot": spot,
                "memory_gib": self.memory_gib, "date": self.date.isoformat()}


@dataclass(frozen=True)
class Catalogue:
    offers: tuple[Offer, ...]
    files: dict[str, dt.date]        # cloud -> its file's date
    directory: str

    @property
    def oldest(self) -> dt.date:
        return min(self.files.values())

    def cheapest(self, names: tuple[str, ...], count: int, spot: bool = False) -> Offer | None:
        """The cheapest offer of `count` GPUs called any of `names` (SkyPilot's names), on-demand or spot."""
        wanted = {n.lower() for n in names}
        found = [o for o in self.offers if o.accelerator.lower() in wanted and o.count == count
                 and o.per_gpu_hour(spot) is not None]
        return min(found, key=lambda o: (o.per_gpu_hour(spot), o.cloud, o.region, o.instance_type), default=None)


def runtime_dir() -> str:
    """Where SkyPilot keeps `.sky/` (sky/skylet/runtime_utils.get_runtime_dir_path): $SKY_RUNTIME_DIR or home."""
    return os.path.expanduser(os.environ.get("SKY_RUNTIME_DIR") or "~")


def catalogue_dir(root: str | None = None) -> Path | None:
    """The newest schema version's directory under .sky/catalogs (v8 for SkyPilot 0.14), or None."""
    base = Path(root or runtime_dir()) / ".sky" / "catalogs"
    try:
        versions = [p for p in base.iterdir() if p.is_dir() and re.fullmatch(r"v\d+", p.name)]
    except OSError:
        return None
    return max(versions, key=lambda p: int(p.name[1:]), default=None)


def _number(text: str | None) -> float | None:
    try:
        x = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return x if x is not None and x == x and x >= 0 else None      # NaN and negatives are no price


def read_offers(path: Path, cloud: str, date: dt.date) -> list[Offer]:
    """The GPU instance offers of one cloud's vms.csv (rows with an instance type and a GPU count)."""
    from wizard.fsutil import read_text_limited
    text = read_text_limited(str(path), MAX_CATALOGUE_BYTES, "prices", PRICES_ALLOWED)
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError("prices", f"{path} is not a SkyPilot catalogue (no {', '.join(missing)} column)",
                         PRICES_ALLOWED)
    out = []
    for row in reader:
        name, instance = (row.get("AcceleratorName") or "").strip(), (row.get("InstanceType") or "").strip()
        count = _number(row.get("AcceleratorCount"))
        if not name or not instance or not count or count != int(count):
            continue                 # CPU instances, GCP's attachable GPUs, fractional GPUs
        out.append(Offer(cloud, instance, name, int(count), _number(row.get("Price")),
                         _number(row.get("SpotPrice")), (row.get("Region") or "").strip(),
                         (row.get("AvailabilityZone") or "").strip(), _number(row.get("MemoryGiB")), date))
    return out


def load(root: str | None = None, today: dt.date | None = None) -> Catalogue:
    """Every cloud's catalogue SkyPilot downloaded. InputError (exit 2) when there is none, or one is dated in
    the future (a clock or a file that cannot be trusted to say when its prices were true)."""
    directory = catalogue_dir(root)
    where = str(Path(root or runtime_dir()) / ".sky" / "catalogs")
    files = sorted(directory.glob("*/vms.csv")) if directory is not None else []
    if not files:
        raise InputError("prices", f"no SkyPilot price catalogue in {where} (SkyPilot downloads them when it "
                         "first needs one: `sky show-gpus` once, with network)", PRICES_ALLOWED)
    today = today or dt.date.today()
    offers: list[Offer] = []
    dates: dict[str, dt.date] = {}
    for path in files:
        cloud = path.parent.name
        date = dt.date.fromtimestamp(path.stat().st_mtime)
        if date > today:
            raise InputError("prices", f"{path} is dated {date.isoformat()}, after today ({today.isoformat()}): "
                             "prices cannot be from the future (check the clock, or download the catalogue again)",
                             PRICES_ALLOWED)
        dates[cloud] = date
        offers += read_offers(path, cloud, date)
    return Catalogue(tuple(offers), dates, str(directory))
