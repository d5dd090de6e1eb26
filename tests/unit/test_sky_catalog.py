"""--prices skypilot (issue 40): the offers of SkyPilot's downloaded catalogues, read the way SkyPilot's own code
lists them, the cheapest named; a missing, stale or future-dated catalogue is one line. The fixture is in SkyPilot's
CSV layouts (AWS, Lambda, RunPod and GCP columns as its fetchers write them; illustrative prices)."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.skypilot import skypilot_cheapest
from wizard import compare as compare_mod
from wizard import sky_catalog
from wizard.errors import InputError
from wizard.probe import catalogue

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "skypilot"
V8 = FIXTURE / ".sky" / "catalogs" / "v8"


def test_offers_are_read_as_skypilots_own_catalogue_code_lists_them(tmp_path):
    """The cheapest on-demand offer per accelerator and count equals what sky.catalog.common.list_accelerators_impl
    finds in the same files (AWS, Lambda, RunPod: the clouds that list through it)."""
    cat = sky_catalog.load(str(FIXTURE))
    theirs = skypilot_cheapest({c: V8 / c / "vms.csv" for c in ("aws", "lambda", "runpod")}, tmp_path / "home")
    assert theirs
    for key, (price, cloud, _instance, _region) in theirs.items():
        name, count = key.rsplit(":", 1)
        ours = sky_catalog.Catalogue(tuple(o for o in cat.offers if o.cloud != "gcp"), cat.files, cat.directory)
        offer = ours.cheapest((name,), int(count))
        assert offer is not None and offer.price == pytest.approx(price) and offer.cloud == cloud, key


def test_cheapest_offer_per_machine_across_names_and_clouds():
    cat = sky_catalog.load(str(FIXTURE))
    assert set(cat.files) == {"aws", "gcp", "lambda", "runpod"}
    prices = compare_mod.Prices(catalogue=cat, date=cat.oldest)
    # 8 H100s: RunPod calls its SXM boards H100-SXM, Lambda and AWS H100; the cheapest of all three
    offer = prices.offer_for(compare_mod.machine("8xH100-80GB"))
    assert (offer.cloud, offer.instance_type, offer.price) == ("runpod", "8x_H100-SXM_SECURE", 21.52)
    assert prices.for_machine(compare_mod.machine("2x8xH100-80GB")) == pytest.approx(21.52 / 8)
    assert prices.offer_for(compare_mod.machine("1xH100-PCIe-80GB")).instance_type == "gpu_1x_h100_pcie"
    # GCP's L4 alone (no instance type: the GPU without the VM it attaches to) is no machine's price
    l4 = prices.offer_for(compare_mod.machine("1xL4"))
    assert (l4.cloud, l4.price) == ("runpod", 0.43)
    assert not any(o.cloud == "gcp" and not o.instance_type for o in cat.offers)
    assert prices.offer_for(compare_mod.machine("4xL4")) is None        # no 4-L4 instance in the fixture
    spot = compare_mod.Prices(catalogue=cat, spot=True)
    assert spot.for_machine(compare_mod.machine("1xL4")) == pytest.approx(0.22)
    # the user's price for a GPU wins over the catalogue, and is labelled as theirs
    mixed = compare_mod.Prices(per_gpu_hour={"L4-24GB": 0.1}, catalogue=cat)
    assert mixed.for_machine(compare_mod.machine("1xL4")) == 0.1 and mixed.offer_for(compare_mod.machine("1xL4")) is None
    assert "SkyPilot's catalogues" in mixed.label and "yours (--price)" in mixed.label


def test_every_default_machines_gpu_has_a_skypilot_name_and_names_are_skypilots():
    for m in compare_mod.default_machines():
        assert catalogue.skypilot_names(catalogue.by_name(m.gpu_names[0])), m.label
    assert set(catalogue.SKYPILOT_NAMES) <= set(catalogue.names())


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "rt"
    shutil.copytree(FIXTURE, root)
    return root


def test_missing_stale_and_future_catalogues(tmp_path, monkeypatch):
    monkeypatch.setenv("SKY_RUNTIME_DIR", str(tmp_path / "empty"))
    with pytest.raises(InputError) as exc:
        compare_mod.prices_from(None, "skypilot")
    assert exc.value.field == "prices" and "sky show-gpus" in str(exc.value)
    root = _copy(tmp_path)
    monkeypatch.setenv("SKY_RUNTIME_DIR", str(root))
    old = time.time() - 45 * 86400
    os.utime(root / ".sky/catalogs/v8/aws/vms.csv", (old, old))
    prices = compare_mod.prices_from(None, "skypilot")
    warning = compare_mod.stale_prices_warning(prices)
    assert warning and "45 days ago" in warning and "catalogues of aws in" in warning and "sky show-gpus" in warning
    future = time.time() + 3 * 86400
    os.utime(root / ".sky/catalogs/v8/lambda/vms.csv", (future, future))
    with pytest.raises(InputError) as exc:
        compare_mod.prices_from(None, "skypilot")
    assert "after today" in str(exc.value) and "lambda" in str(exc.value)


def test_a_catalogue_without_skypilots_columns_is_refused(tmp_path):
    root = tmp_path / "rt" / ".sky" / "catalogs" / "v8" / "aws"
    root.mkdir(parents=True)
    (root / "vms.csv").write_text("name,price\nx,1\n")
    with pytest.raises(InputError) as exc:
        sky_catalog.load(str(tmp_path / "rt"))
    assert "not a SkyPilot catalogue" in str(exc.value)


def test_prices_file_from_the_future_is_refused(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("date: 2027-01-05\nprices:\n  H100: 2\n")
    with pytest.raises(InputError) as exc:
        compare_mod.load_prices_file(str(f), today=dt.date(2026, 12, 6))
    assert "after today" in str(exc.value)
    assert compare_mod.load_prices_file(str(f), today=dt.date(2027, 1, 5)).date == dt.date(2027, 1, 5)


def test_a_bare_model_name_says_which_classes_it_priced():
    notes: list[str] = []
    priced = compare_mod.parse_price_flag("A100=1.8,H100-80GB=2.5", notes)
    assert priced == {"A100-80GB": 1.8, "H100-80GB": 2.5}
    assert len(notes) == 1 and "priced A100-80GB only" in notes[0]
    assert all(n in notes[0] for n in ("A100-40GB", "A100-PCIe-80GB", "A100-PCIe-40GB"))
    prices = compare_mod.prices_from("A100=1.8", None)
    assert prices.notes == tuple(notes)
