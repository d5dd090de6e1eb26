"""`wizard compare`: which machine to rent. One plan per machine, side by side: the plan's choice, its speed, the
time to train the run's tokens and what that costs at the user's prices.

Every row is `wizard plan --assume MACHINE` with the same answers: wizard.pipeline.build, nothing planned here.
The model is sized once (the first build; every later one reads the sizing cache) and planned per machine.
Prices are the user's (--price, --prices FILE): the project ships none, as they change weekly and differ by
provider. No UI and no heavy library is imported here.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from wizard.errors import InputError
from wizard.pipeline import Request, Result, build
from wizard.probe import catalogue
from wizard.probe import hardware as hardware_mod

SORTS = ("time", "cost")
MACHINE_FORMAT = ("machines such as 8xA100-80GB,4xH100-80GB,1xH200-141GB,2x8xH100-80GB (NODESxGPUSxGPU for "
                  "several machines; --assume's key=value options, e.g. 8xH100-80GB,ram=2T, follow their machine)")
PRICE_FORMAT = ("MACHINE=PRICE or GPU=PRICE per GPU-hour, comma-separated, such as 8xA100-80GB=1.8,H100-80GB=2.5")
PRICES_FILE_FORMAT = ("a YAML file with `date: YYYY-MM-DD` and `prices:` mapping MACHINE or GPU to a price per "
                      "GPU-hour (optionally `currency:`)")
STALE_PRICE_DAYS = 30
DEFAULT_TRAIN_TOKENS = 10**9          # the time and cost shown when the run's tokens are not given: per 1B tokens
DEFAULT_COUNTS = (1, 2, 4, 8)
NODE_GPUS = 8                          # a server of the largest GPU, twice, for the multi-machine row
# Machine flags the comparison sets itself, one machine per row: refused rather than applied to every machine.
MACHINE_QUESTIONS = ("num_machines", "machine_rank", "num_processes", "gpu_ids", "use_cpu")
CAVEAT = ("These are planned figures (the wizard's memory and speed model, not a measurement): `wizard tune` "
          "measures them on the machine once you have it, and machines it has measured are marked \"measured\".")


# ----------------------------------------------------------------------------- machines

@dataclass(frozen=True)
class Machine:
    label: str                        # what the user wrote (or the default set's name): "2x8xH100-80GB"
    assume: str                       # the --assume spec it plans: "8xH100-80GB,nodes=2"
    gpus: int                         # GPUs over every machine
    nodes: int = 1
    gpu_names: tuple[str, ...] = ()   # catalogue names of its GPUs ("H100-80GB"), for GPU=PRICE
    key: str = ""                     # canonical: "2x8xH100-80GB" for "2x8xh100", for prices and duplicates


_NODES = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+\s*[xX×].*)$")


def machine(text: str) -> Machine:
    """One machine of --machines: an --assume SPEC, or NODESxSPEC (2x8xH100-80GB) for several machines."""
    label = text.strip()
    head, *options = [p.strip() for p in label.split(",")]
    nodes = 1
    m = _NODES.match(head)
    if m:
        nodes, head = int(m.group(1)), m.group(2).strip()
        if nodes < 1 or any(o.lower().startswith("nodes=") for o in options):
            raise InputError("machines", f"{label!r}: give the machines once (NODESx... or nodes=N)", MACHINE_FORMAT)
        options.append(f"nodes={nodes}")
    spec = ",".join([head] + options)
    try:
        hw = hardware_mod.assume(spec)
    except InputError as exc:
        raise InputError("machines", f"{label!r}: {exc.problem}", exc.allowed or MACHINE_FORMAT) from None
    nodes = hw.num_machines_hint or nodes
    per_gpu = [_catalogue_name(g.name) for g in hw.gpus]
    names = tuple(dict.fromkeys(per_gpu))
    server = "+".join(f"{per_gpu.count(n)}x{n}" for n in names)
    key = (f"{nodes}x" if nodes > 1 else "") + server
    return Machine(label=label, assume=spec, gpus=len(hw.gpus) * nodes, nodes=nodes, gpu_names=names, key=key)


def _catalogue_name(nvml_name: str) -> str:
    spec = catalogue.match_device(nvml_name)
    return spec.name if spec is not None else nvml_name


def parse_machines(text: str) -> list[Machine]:
    """--machines: machines separated by commas; a key=value piece belongs to the machine before it."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("machines", "is empty", MACHINE_FORMAT)
    groups: list[list[str]] = []
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            raise InputError("machines", f"{text.strip()!r} has an empty entry", MACHINE_FORMAT)
        if "=" in piece:
            if not groups:
                raise InputError("machines", f"{piece!r} comes before any machine", MACHINE_FORMAT)
            groups[-1].append(piece)
        else:
            groups.append([piece])
    machines = [machine(",".join(g)) for g in groups]
    seen: set[tuple] = set()
    for m in machines:
        same = (m.key, tuple(sorted(o.replace(" ", "").lower() for o in m.assume.split(",")[1:])))
        if same in seen:
            raise InputError("machines", f"{m.label!r} is given twice", MACHINE_FORMAT)
        seen.add(same)
    return machines


# The PCIe cards people rent one to eight at a time from GPU clouds (RunPod, Lambda, AWS g5/g6/g6e, ...), beside the
# NVLink servers: the cheap machines a LoRA or QLoRA run fits on.
RENTED_CARDS = ("H100-PCIe-80GB", "L40S-48GB", "A10G-24GB", "L4-24GB", "RTX4090-24GB")


def default_classes() -> list[catalogue.GpuSpec]:
    """The data-centre GPUs rented as NVLink servers, one per generation and memory size (the catalogue's first:
    H100-80GB, not its export twin H800-80GB; A100-80GB, not A800-80GB), then the rented PCIe cards."""
    out: dict[tuple[str, int], catalogue.GpuSpec] = {}
    for spec in catalogue.CATALOGUE:
        if spec.kind == "datacenter" and spec.nvlink:
            key = (catalogue.performance(spec).generation, spec.mem_tags[0])
            out.setdefault(key, spec)
    return list(out.values()) + [catalogue.by_name(name) for name in RENTED_CARDS]


def default_machines(max_gpus: int | None = None) -> list[Machine]:
    """1, 2, 4 and 8 of each default class, and two 8-GPU servers of the NVLink class with the most memory; at
    most `max_gpus` GPUs in all."""
    classes = default_classes()
    specs = [f"{n}x{spec.name}" for spec in classes for n in DEFAULT_COUNTS]
    largest = max((s for s in classes if s.nvlink), key=lambda s: s.memory)
    specs.append(f"2x{NODE_GPUS}x{largest.name}")
    machines = [machine(s) for s in specs]
    return [m for m in machines if max_gpus is None or m.gpus <= max_gpus]


def check_max_gpus(value: Any) -> int | None:
    if value is None:
        return None
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise InputError("max-gpus", f"{value!r} is not a whole number of GPUs >= 1", "1, 8, 16, ...")
    return n


# ----------------------------------------------------------------------------- prices

@dataclass(frozen=True)
class Prices:
    per_gpu_hour: dict[str, float] = field(default_factory=dict)   # machine label or GPU name -> price
    date: dt.date | None = None       # the prices file's date (None: --price only); the oldest catalogue's
    source: str = ""                  # the file, for the staleness warning
    currency: str = ""
    notes: tuple[str, ...] = ()       # what a GPU=PRICE entry priced, when the name covers several classes
    catalogue: Any = None             # wizard.sky_catalog.Catalogue for --prices skypilot
    spot: bool = False                # --prices skypilot-spot

    def for_machine(self, m: Machine) -> float | None:
        """The user's price for the machine, else its GPU's (every GPU of it the same model), else the cheapest
        catalogue offer of its GPUs per node."""
        if m.key in self.per_gpu_hour:
            return self.per_gpu_hour[m.key]
        if len(m.gpu_names) == 1 and m.gpu_names[0] in self.per_gpu_hour:
            return self.per_gpu_hour[m.gpu_names[0]]
        offer = self.offer_for(m)
        return offer.per_gpu_hour(self.spot) if offer is not None else None

    def offer_for(self, m: Machine) -> Any:
        """The catalogue's cheapest instance with this machine's GPUs per node (None without a catalogue, or when
        the user priced the machine or its GPU)."""
        if self.catalogue is None or len(m.gpu_names) != 1 or m.key in self.per_gpu_hour \
                or m.gpu_names[0] in self.per_gpu_hour:
            return None
        try:
            names = catalogue.skypilot_names(catalogue.by_name(m.gpu_names[0]))
        except KeyError:
            return None
        return self.catalogue.cheapest(names, m.gpus // m.nodes, self.spot) if names else None

    @property
    def label(self) -> str:
        """Where the prices come from, said beside the costs: SkyPilot's catalogues or the user's."""
        parts = []
        if self.catalogue is not None:
            dates = ", ".join(f"{cloud} {d.isoformat()}" for cloud, d in sorted(self.catalogue.files.items()))
            parts.append(f"SkyPilot's catalogues ({'spot' if self.spot else 'on-demand'}; files of {dates})")
        if self.per_gpu_hour:
            own_file = self.source and self.catalogue is None
            parts.append("yours (" + (f"--prices {self.source}, dated {self.date.isoformat()}" if own_file
                                      and self.date else "--price") + ")")
        return "Prices: " + "; ".join(parts) + "." if parts else ""


SKYPILOT_PRICES = {"skypilot": False, "skypilot-spot": True}       # --prices word -> spot


def _price_key(key: str, field_name: str, allowed: str, notes: list[str] | None = None) -> str:
    """A machine as --machines writes it, or a GPU by its catalogue name (H100 -> H100-80GB). A model name that
    covers several classes (A100: 80 and 40 GB, SXM and PCIe) prices the one taken for it, and `notes` says which,
    and the others it leaves unpriced."""
    key = key.strip()
    if re.match(r"\s*\d+\s*[xX×]", key):
        try:
            return machine(key).key
        except InputError as exc:
            raise InputError(field_name, exc.problem, allowed) from None
    try:
        spec, _note = catalogue.resolve(key, field_name)
    except InputError:
        raise InputError(field_name, f"{key!r} is neither a machine nor a GPU", allowed) from None
    model = spec.name.split("-")[0]          # "A100" of A100-80GB, A100-40GB, A100-PCIe-80GB, ...
    others = [s.name for s in catalogue.CATALOGUE if s.name.split("-")[0] == model and s is not spec]
    if notes is not None and others and key.upper() != spec.name.upper():
        notes.append(f"{key}= priced {spec.name} only (the class a bare {key!r} means); {', '.join(others)} "
                     f"{'is' if len(others) == 1 else 'are'} not priced by it: name {'it' if len(others) == 1 else 'them'}"
                     f" (e.g. {others[0]}=PRICE)")
    return spec.name


def _price_value(value: Any, key: str, field_name: str, allowed: str) -> float:
    try:
        price = float(str(value).strip().lstrip("$"))
    except ValueError:
        price = float("nan")
    if not (math.isfinite(price) and price >= 0):
        raise InputError(field_name, f"{key}={value!r} is not a price per GPU-hour", allowed)
    return price


def parse_price_flag(text: str, notes: list[str] | None = None) -> dict[str, float]:
    """--price 8xA100-80GB=1.8,H100-80GB=2.5 -> {machine or GPU: price per GPU-hour}."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("price", "is empty", PRICE_FORMAT)
    out: dict[str, float] = {}
    for piece in text.split(","):
        key, eq, value = piece.partition("=")
        if not eq or not key.strip():
            raise InputError("price", f"{piece.strip()!r} is not MACHINE=PRICE", PRICE_FORMAT)
        out[_price_key(key, "price", PRICE_FORMAT, notes)] = _price_value(value, key.strip(), "price", PRICE_FORMAT)
    return out


def load_prices_file(path: str, today: dt.date | None = None, notes: list[str] | None = None) -> Prices:
    """--prices FILE: `date:` (required: prices change weekly; not after today) and `prices:` {MACHINE or GPU:
    per GPU-hour}."""
    from wizard.fsutil import loads_limited, quote_path, read_text_limited
    text = read_text_limited(path, 1 << 20, "prices", PRICES_FILE_FORMAT)
    doc = loads_limited(text, "yaml", "prices", quote_path(path), PRICES_FILE_FORMAT)
    if not isinstance(doc, dict) or not isinstance(doc.get("prices"), dict) or not doc["prices"]:
        raise InputError("prices", f"{quote_path(path)} has no `prices:` mapping", PRICES_FILE_FORMAT)
    date = _file_date(doc.get("date"), path)
    today = today or dt.date.today()
    if date > today:
        raise InputError("prices", f"{path} is dated {date.isoformat()}, after today ({today.isoformat()}): a price "
                         "cannot have been true on a day still to come (a typo in the year?)", PRICES_FILE_FORMAT)
    notes = [] if notes is None else notes
    prices = {_price_key(str(k), "prices", PRICES_FILE_FORMAT, notes):
              _price_value(v, str(k), "prices", PRICES_FILE_FORMAT) for k, v in doc["prices"].items()}
    currency = doc.get("currency")
    return Prices(prices, date, path, str(currency).strip() if currency else "", tuple(notes))


def _file_date(value: Any, path: str) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError:
        pass
    what = "has no `date:`" if value is None else f"has date {value!r}, not YYYY-MM-DD"
    raise InputError("prices", f"{path} {what} (prices change; the file says when they were true)",
                     PRICES_FILE_FORMAT)


def prices_from(flag: str | None, path: str | None, today: dt.date | None = None) -> Prices:
    """The file's prices (or SkyPilot's catalogues: --prices skypilot) with --price's over them."""
    notes: list[str] = []
    if path is not None and path.strip().lower() in SKYPILOT_PRICES:
        from wizard import sky_catalog
        cat = sky_catalog.load(today=today)
        prices = Prices(date=cat.oldest, source=cat.directory, currency="USD", catalogue=cat,
                        spot=SKYPILOT_PRICES[path.strip().lower()])
    else:
        prices = load_prices_file(path, today, notes) if path else Prices()
    if flag:
        prices = replace(prices, per_gpu_hour={**prices.per_gpu_hour, **parse_price_flag(flag, notes)})
    return replace(prices, notes=tuple(dict.fromkeys(notes)))


def stale_prices_warning(prices: Prices, today: dt.date | None = None) -> str | None:
    if prices.date is None:
        return None
    today = today or dt.date.today()
    age = (today - prices.date).days
    if age <= STALE_PRICE_DAYS:
        return None
    if prices.catalogue is not None:
        old = sorted(cloud for cloud, d in prices.catalogue.files.items() if (today - d).days > STALE_PRICE_DAYS)
        return (f"SkyPilot's catalogues of {', '.join(old)} in {prices.source} are dated up to {age} days ago (more "
                f"than {STALE_PRICE_DAYS}): GPU prices change weekly; `sky show-gpus` with network refreshes them")
    return (f"the prices in {prices.source} are dated {prices.date.isoformat()}, {age} days ago (more than "
            f"{STALE_PRICE_DAYS}): GPU prices change weekly; update the file")


# ----------------------------------------------------------------------------- rows

@dataclass
class Row:
    machine: Machine
    fits: bool = False
    rung_key: str | None = None
    rung: str | None = None           # the chosen rung's name (gradient checkpointing apart)
    micro_batch: int | None = None
    grad_accum: int | None = None
    gradient_checkpointing: bool | None = None
    tokens_per_second: float | None = None
    step_seconds: float | None = None
    train_seconds: float | None = None
    price_per_gpu_hour: float | None = None
    cost: float | None = None
    short_by: float | None = None     # does not fit: need / have of the closest rung's tightest constraint
    shortfall: str | None = None      # ... in words (the same phrase as exit 3's)
    shortfall_rung: str | None = None     # ... that rung's name (the shortfall's first words)
    error: str | None = None          # this machine could not be planned with these answers: why
    measured: str | None = None       # the choice's speed is `wizard tune`'s measurement: trials and date
    fastest: bool = False
    cheapest: bool = False
    write_command: str | None = None  # the command that writes this row's files (fitting rows)
    global_batch: int | None = None   # sequences per optimizer step (the plan's)
    per_gpu_bytes: int | None = None  # the chosen rung's (a miss: the closest rung's) memory per GPU
    gpu_memory_bytes: int | None = None   # each GPU's memory (the smallest)
    host_ram_bytes: int | None = None     # host RAM per machine the plan assumed (--assume ...,ram=SIZE)
    host_ram_need_bytes: int | None = None    # what the chosen rung keeps in host RAM per machine
    offer: Any = None                 # wizard.sky_catalog.Offer that priced it (--prices skypilot)
    offer_spot: bool = False          # ... at its spot price
    price_source: str | None = None   # "yours" (--price, --prices FILE) or "skypilot"
    result: Result | None = field(default=None, repr=False)

    @property
    def status(self) -> str:
        if self.error:
            return "cannot plan"
        return "fits" if self.fits else "does not fit"

    def to_json(self) -> dict[str, Any]:
        return {"machine": self.machine.label, "assume": self.machine.assume, "gpus": self.machine.gpus,
                "nodes": self.machine.nodes, "status": self.status, "fits": self.fits, "rung": self.rung_key,
                "rung_name": self.rung, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "gradient_checkpointing": self.gradient_checkpointing,
                "tokens_per_second": _round(self.tokens_per_second, 1), "step_seconds": _round(self.step_seconds, 4),
                "train_seconds": _round(self.train_seconds, 1), "price_per_gpu_hour": self.price_per_gpu_hour,
                "cost": _round(self.cost, 2), "short_by": _round(self.short_by, 3), "shortfall": self.shortfall,
                "shortfall_rung": self.shortfall_rung,
                "error": self.error, "measured": self.measured, "fastest": self.fastest, "cheapest": self.cheapest,
                "write_command": self.write_command, "global_batch": self.global_batch,
                "per_gpu_bytes": self.per_gpu_bytes, "gpu_memory_bytes": self.gpu_memory_bytes,
                "host_ram_bytes": self.host_ram_bytes, "host_ram_need_bytes": self.host_ram_need_bytes,
                "price_source": self.price_source,
                "offer": self.offer.to_json(self.offer_spot) if self.offer is not None else None}


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


@dataclass
class Comparison:
    rows: list[Row]
    train_tokens: int                 # the tokens the times and costs are for
    tokens_given: bool                # False: DEFAULT_TRAIN_TOKENS, per 1B tokens
    sort: str
    model: str = ""
    method: str = "full"
    warnings: list[str] = field(default_factory=list)
    currency: str = ""
    global_batch: int | None = None   # what every row trains per optimizer step
    global_batch_given: bool = False  # the user's --global-batch (else GLOBAL_BATCH_DEFAULT's rule)
    price_date: dt.date | None = None
    prices_label: str = ""

    @property
    def fastest(self) -> Row | None:
        return next((r for r in self.rows if r.fastest), None)

    @property
    def cheapest(self) -> Row | None:
        return next((r for r in self.rows if r.cheapest), None)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "method": self.method, "train_tokens": self.train_tokens,
                "train_tokens_given": self.tokens_given, "sort": self.sort, "currency": self.currency,
                "fastest": self.fastest.machine.label if self.fastest else None,
                "cheapest": self.cheapest.machine.label if self.cheapest else None,
                "caveat": CAVEAT, "warnings": list(self.warnings), "rows": [r.to_json() for r in self.rows],
                "global_batch": self.global_batch, "global_batch_given": self.global_batch_given,
                "price_date": self.price_date.isoformat() if self.price_date else None, "prices": self.prices_label}


def refuse_machine_answers(given: dict[str, Any]) -> None:
    """The machine flags are each row's own: --num-processes 8 on a 1-GPU row is no comparison."""
    from wizard.config.questions import by_id
    for qid in MACHINE_QUESTIONS:
        if given.get(qid) is not None:
            q = by_id(qid)
            raise InputError(q.field, f"{q.flag} is set by each machine of the comparison",
                             "--machines with the machines to compare (NODESxGPUSxGPU for several machines)")


def plan_row(m: Machine, given: dict[str, Any], price: float | None, calibrate: bool = True) -> Row:
    """`wizard plan --assume MACHINE` with these answers, as one row."""
    row = Row(machine=m, price_per_gpu_hour=price)
    try:
        result = build(Request(given=given, assume=m.assume, plan_only=True, calibrate=calibrate,
                               calibrate_assumed=calibrate))
    except InputError as exc:
        row.error = str(exc)
        return row
    row.result = result
    plan = result.plan
    c = plan.choice
    row.gpu_memory_bytes = result.hardware.min_gpu_memory or None
    row.host_ram_bytes = result.hardware.ram_total or None
    if c is None:
        row.short_by, row.shortfall, row.per_gpu_bytes, row.shortfall_rung = closest_miss(result)
        return row
    row.per_gpu_bytes, row.host_ram_need_bytes = c.per_gpu_bytes, c.cpu_bytes
    # sequences per optimizer step: the plan's split of it (a context-parallel rung shares each sequence among
    # cp GPUs), else micro-batch x accumulation x GPUs
    row.global_batch = plan.batch.global_batch if plan.batch is not None else \
        (c.micro_batch or 1) * (c.grad_accum or 1) * m.gpus
    speed = c.speed
    row.fits, row.rung_key, row.rung = True, c.key, c.name
    row.micro_batch, row.grad_accum, row.gradient_checkpointing = c.micro_batch, c.grad_accum, c.gradient_checkpointing
    if speed is not None:
        row.tokens_per_second, row.step_seconds = speed.tokens_per_second, speed.step_seconds
    if c.calibration:
        trials = c.calibration.get("trials")
        date = c.calibration.get("date") or c.calibration.get("updated")
        row.measured = f"{trials} trial{'s' if trials != 1 else ''}" + (f" on {date}" if date else "")
    return row


def closest_miss(result: Result) -> tuple[float | None, str | None, int | None, str | None]:
    """(need / have, what it needs, its bytes per GPU, its name) of the rung closest to fitting: the rung and the
    measure exit 3 names (wizard.planning.plan.closest_shortfall, the one both call)."""
    from wizard.config import answers as answers_mod
    from wizard.planning.plan import closest_shortfall
    closest = closest_shortfall(result.plan, result.hardware, answers_mod.strategy_options(result.answers))
    if closest is None:
        return None, None, None, None
    ratio, phrase, rung = closest
    return ratio, f"{rung.name} {phrase}", rung.per_gpu_bytes, rung.name


def train_tokens_of(result: Result) -> int | None:
    return result.plan.train_tokens


def compare(given: dict[str, Any], machines: list[Machine], prices: Prices | None = None, sort: str = "time",
            calibrate: bool = True, today: dt.date | None = None,
            command_for: Callable[[Machine], str] | None = None) -> Comparison:
    """One row per machine, sorted by `sort` (time or cost), the fastest and the cheapest marked."""
    if sort not in SORTS:
        raise InputError("sort", f"{sort!r} is not a sort order", "|".join(SORTS))
    if not machines:
        raise InputError("max-gpus", "leaves no machine to compare", "a larger --max-gpus, or --machines")
    refuse_machine_answers(given)
    batch, batch_given = equal_global_batch(given, machines)
    given = {**given, "global_batch": batch} if batch is not None else given
    rows = [plan_row(m, given, None, calibrate) for m in machines]
    planned = [r for r in rows if r.result is not None]
    if not planned:
        # The same bad answer on every machine is the answers' fault, not the machines': exit 2 as `plan` does.
        build(Request(given=given, assume=machines[0].assume, plan_only=True, calibrate=calibrate))
    first = planned[0].result
    tokens = train_tokens_of(first)
    for r in rows:
        if r.fits and r.tokens_per_second:
            r.train_seconds = (tokens or DEFAULT_TRAIN_TOKENS) / r.tokens_per_second
            if command_for is not None:
                r.write_command = command_for(r.machine)
    planned_only = Comparison(rows=rows, train_tokens=tokens or DEFAULT_TRAIN_TOKENS, tokens_given=tokens is not None,
                              sort=sort, model=model_name(first.answers),
                              method=str(first.answers.get("method", "full")), global_batch=batch,
                              global_batch_given=batch_given)
    return priced(planned_only, prices or Prices(), today)


def equal_global_batch(given: dict[str, Any], machines: list[Machine]) -> tuple[int | None, bool]:
    """(the global batch every row trains, whether it is the user's). The user's --global-batch, else the
    micro-batch x accumulation asked for (1 x 1 by default) on the machine count that every machine divides: the
    least common multiple of their GPU counts (16 for 1, 2, 4, 8 and 2 x 8), so each row trains the same
    sequences per optimizer step and rows differ in time and cost only. None: a value the planner will refuse."""
    if given.get("global_batch") is not None:
        try:
            return int(str(given["global_batch"]).strip()), True
        except ValueError:
            return None, True
    try:
        per_gpu = int(str(given.get("micro_batch") or 1).strip()) * int(str(given.get("grad_accum") or 1).strip())
    except ValueError:
        return None, False
    return per_gpu * math.lcm(*(m.gpus for m in machines)), False


def model_name(answers: dict[str, Any]) -> str:
    """The model as the user named it, or '7B parameters' for --params."""
    if answers.get("model"):
        return str(answers["model"])
    from wizard.units import fmt_count
    return f"{fmt_count(answers.get('params'))} parameters" if answers.get("params") else ""


def priced(c: Comparison, prices: Prices, today: dt.date | None = None) -> Comparison:
    """The comparison at these prices: each row's cost, the marks, the order and the warnings (no planning: the
    TUI re-prices as the user types)."""
    rows = [replace(r, price_per_gpu_hour=prices.for_machine(r.machine), offer=prices.offer_for(r.machine),
                    offer_spot=prices.spot, price_source=None, cost=None, fastest=False, cheapest=False)
            for r in c.rows]
    for r in rows:
        if r.price_per_gpu_hour is not None:
            r.price_source = "skypilot" if r.offer is not None else "yours"
    for r in rows:
        if r.train_seconds and r.price_per_gpu_hour is not None:
            r.cost = r.price_per_gpu_hour * r.machine.gpus * r.train_seconds / 3600
    mark_best(rows)
    rows = sorted_rows(rows, c.sort)
    warnings = [w for w in (stale_prices_warning(prices, today),) if w]
    if c.sort == "cost" and not any(r.cost is not None for r in rows):
        warnings.append("no machine has a price: give --price MACHINE=PRICE or --prices FILE to sort by cost")
    unpriced = [r.machine.label for r in rows if r.fits and r.cost is None]
    if (prices.per_gpu_hour or prices.catalogue is not None) and unpriced:
        warnings.append(f"no price for {', '.join(unpriced)}" +
                        (" in SkyPilot's catalogues" if prices.catalogue is not None else ""))
    warnings += list(prices.notes)
    return replace(c, rows=rows, warnings=warnings, currency=prices.currency, price_date=prices.date,
                   prices_label=prices.label)


def mark_best(rows: list[Row]) -> None:
    fitting = [r for r in rows if r.fits and r.train_seconds]
    if fitting:
        min(fitting, key=lambda r: (r.train_seconds, r.machine.gpus)).fastest = True
    priced = [r for r in fitting if r.cost is not None]
    if priced:
        min(priced, key=lambda r: (_cents(r.cost), r.train_seconds)).cheapest = True


def fmt_cost(cost: float | None, currency: str = "") -> str:
    """A cost as the table and the TUI show it: to the cent, always, so rows sorted by cost read in order (219.02 after
    218.97: whole units showed both as "219", the cheaper seemingly after the dearer)."""
    if cost is None:
        return "-"
    return f"{cost:,.2f} {currency}" if currency else f"${cost:,.2f}"


def _cents(cost: float) -> float:
    """Costs equal to the cent are a tie (the faster machine first): linear scaling gives 1 and 16 GPUs the same
    cost up to rounding noise."""
    return round(cost, 2)


def sorted_rows(rows: list[Row], sort: str) -> list[Row]:
    """Fitting rows first, by time or cost (unpriced after priced); then the misses, closest first; then the
    machines that could not be planned."""
    def key(r: Row) -> tuple:
        if r.fits:
            if sort == "cost":
                return (0, r.cost is None, _cents(r.cost or 0.0), r.train_seconds or math.inf)
            return (0, False, r.train_seconds or math.inf, r.cost if r.cost is not None else math.inf)
        if r.error is None:
            return (1, False, r.short_by or math.inf, 0.0)
        return (2, False, 0.0, 0.0)
    return sorted(rows, key=key)


# ----------------------------------------------------------------------------- the command to write a row

def write_command(m: Machine, flags: dict[str, Any], answers_file: str | None = None,
                  output_dir: str | None = None) -> str:
    """`wizard --non-interactive --assume SPEC ...`: what `wizard compare --write MACHINE` runs for this row."""
    from wizard.config.questions import by_id
    words = ["wizard", "--non-interactive", "--assume", m.assume]
    if answers_file:
        words += ["--answers", answers_file]
    for qid, value in flags.items():
        if value is None:
            continue
        words += [by_id(qid).flag, str(value)]
    if m.nodes > 1 and "main_process_ip" not in flags:
        words += ["--main-process-ip", "ADDRESS"]
    if output_dir:
        words += ["--output-dir", output_dir]
    return " ".join(shlex.quote(w) if w != "ADDRESS" else w for w in words)


def find_row(comparison: Comparison, label: str) -> Row | None:
    return next((r for r in comparison.rows if r.machine.label == label), None)
