"""The dashboard in a real browser: Debian's Chromium driven by Playwright, against the
real app served over HTTP, with PostgreSQL, Redis and a real worker behind it.

Each test leaves a screenshot of its page in build/screenshots/ (ignored by git), or in
COREL_SCREENSHOTS_DIR; `make screenshots` copies them into docs/screenshots/, which the README
and docs/service.md show.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from pydantic import SecretStr

from app.main import create_app
from harness.wait import wait_until
from tests.app.conftest import finished, held, npz_bytes, serving, wait_for
from tests.conftest import REPO, SHARED_DATASETS, require
from tests.mirror import Mirror

SHOTS = Path(os.environ.get("COREL_SCREENSHOTS_DIR") or REPO / "build" / "screenshots")
CHROMIUM = os.environ.get("COREL_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# As root, in a sandbox with no network: no sandbox, and none of Chromium's own calls out.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
FAST = {"dataset": "digits", "model": "ffnn", "lr": 0.003, "batch_size": 64}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require(Path(CHROMIUM).exists(), f"Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - the test extra installs it
        require(False, "the playwright package (pip install -e '.[test]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def live(settings, worker) -> Iterator[str]:
    with serving(create_app(settings)) as url:
        yield url


@pytest.fixture
def page(browser, live) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900}, base_url=live)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture(scope="module")
def trained(client, worker) -> list[dict]:
    """Two succeeded runs to look at: Gaussian-COREL and Cosine-COREL on digits."""
    ids = [client.post("/experiments", json={**FAST, "loss": loss, "lam": 0.85, "epochs": 6}).json()["id"]
           for loss in ("gaussian", "cosine")]
    runs = [wait_for(client, i, finished) for i in ids]
    assert all(r["status"] == "succeeded" for r in runs), runs
    return runs


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def page_progress(page: Any) -> dict:
    return page.evaluate("""() => ({
        epoch: Number(document.querySelector('#progress [role=progressbar]').getAttribute('aria-valuenow')),
        points: (document.getElementById('curves').data || [{x: []}])[2].x.length,
        status: document.querySelector('#status .badge').dataset.status })""")


def test_a_run_submitted_through_the_form_updates_live_to_succeeded(page, client, workers, worker):
    page.goto("/ui/new")
    page.wait_for_selector("#spec-form[data-ready=true]")
    page.select_option("#f-dataset", "digits")
    page.select_option("#f-loss", "gaussian")
    for field, value in (("lam", "0.85"), ("epochs", "60"), ("lr", "0.003"), ("batch_size", "16")):
        page.fill(f"#f-{field}", value)
    with held(workers) as step:
        page.click("#submit")
        page.wait_for_url("**/ui/experiments/*")
        experiment_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        page.wait_for_selector("#curves .main-svg")
        page.evaluate("window.__sameDocument = true")
        # Let the worker run in short slices; each time it stands still mid-run, the page
        # (without a reload) must come to show the epoch the database holds, bar and curve.
        seen: list[int] = []
        deadline = time.monotonic() + 180
        while len(seen) < 2:
            assert time.monotonic() < deadline, seen
            step(0.05)
            body = client.get(f"/experiments/{experiment_id}").json()
            epoch = body["current_epoch"] or 0
            assert epoch < 60, f"the run ended within a slice: {body}"
            if epoch == 0 or epoch in seen:
                continue
            page.wait_for_function(
                f"""() => Number(document.querySelector('#progress [role=progressbar]')
                        .getAttribute('aria-valuenow')) === {epoch}
                    && (document.getElementById('curves').data || [{{x: []}}])[2].x.length === {epoch}""",
                timeout=20_000)
            assert page_progress(page)["status"] == "running"
            seen.append(epoch)
            if len(seen) == 1:
                shot(page, "experiment-live")  # mid-run: the curves half drawn
    page.wait_for_function("document.querySelector('#status .badge').dataset.status === 'succeeded'",
                           timeout=180_000)
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    stored = client.get(f"/experiments/{experiment_id}/metrics").json()["items"]
    page.wait_for_function("document.getElementById('curves').data[2].x.length === 60")
    assert page_progress(page)["epoch"] == 60
    drawn = page.evaluate("document.getElementById('curves').data[2].y")
    np.testing.assert_allclose(drawn, [m["val_accuracy"] for m in stored])
    assert page.locator("#metrics tbody tr").count() == 60
    assert client.get(f"/experiments/{experiment_id}").json()["spec"]["lam"] == 0.85


def test_the_form_starts_at_the_quick_budget_and_a_field_filled_in_wins(page, client):
    page.goto("/ui/new")
    page.wait_for_selector("#spec-form[data-ready=true]")
    assert page.input_value("#f-budget") == "quick"
    for field, shown in (("lr", "quick: 0.001"), ("epochs", "quick: 10"), ("batch_size", "quick: 64")):
        assert page.input_value(f"#f-{field}") == "" and page.get_attribute(f"#f-{field}", "placeholder") == shown
        # Its help says what empty means now (it said the schema's "Default 128.").
        box = page.locator(f'.field[data-field="{field}"] .help').inner_text()
        assert box.endswith(f"Left empty: {shown.split(': ')[1]} (the quick budget).") and "Default" not in box
    page.select_option("#f-budget", "paper")
    assert page.get_attribute("#f-lr", "placeholder") == "paper: 0.0001"
    assert page.locator('.field[data-field="lr"] .help').inner_text().endswith(
        "Left empty: 0.0001 (the paper budget).")
    page.select_option("#f-budget", "quick")
    page.select_option("#f-dataset", "digits")
    page.fill("#f-epochs", "2")
    page.select_option("#f-budget", "paper")  # a field filled in stays as filled
    assert page.input_value("#f-epochs") == "2"
    page.select_option("#f-budget", "quick")
    page.click("#submit")
    page.wait_for_url("**/ui/experiments/*")
    spec = client.get(f"/experiments/{int(page.url.rsplit('/', 1)[1])}").json()["spec"]
    assert (spec["budget"], spec["lr"], spec["batch_size"], spec["epochs"]) == ("quick", 0.001, 64, 2)


def test_a_validation_error_appears_beside_its_field(page):
    page.goto("/ui/new")
    page.wait_for_selector("#spec-form[data-ready=true]")
    page.fill("#f-lam", "1.5")
    page.fill("#f-epochs", "0")
    page.click("#submit")
    page.wait_for_selector(".field.invalid")
    assert "less than or equal to 1" in page.inner_text("#err-lam")
    assert "greater than 0" in page.inner_text("#err-epochs")
    assert page.inner_text("#err-loss") == ""
    assert page.url.endswith("/ui/new")
    shot(page, "new-experiment")


def test_a_loss_s_own_options_show_for_it_and_a_bad_one_is_named_beside_its_field(page, client):
    """margin, scale, ...: shown only for a loss that takes them, its default as placeholder;
    a value out of the loss's range comes back as the API's 422 beside the field."""
    page.goto("/ui/new")
    page.wait_for_selector("#spec-form[data-ready=true]")
    page.select_option("#f-dataset", "digits")
    page.select_option("#f-loss", "gaussian")
    assert page.is_hidden('[data-field="margin"]') and page.is_hidden('[data-field="miner"]')
    page.select_option("#f-loss", "arcface")
    assert page.is_visible('[data-field="margin"]') and page.is_visible('[data-field="scale"]')
    assert page.is_hidden('[data-field="temperature"]')
    assert page.get_attribute("#f-margin", "placeholder") == "default 28.6"
    page.fill("#f-margin", "-3")
    page.click("#submit")
    page.wait_for_selector(".field.invalid")
    assert "must be a number in [0, 90); got -3" in page.inner_text("#err-margin")
    page.select_option("#f-loss", "triplet")
    assert page.is_visible('[data-field="miner"]')
    # Where the miner is chosen, the triplet's own word on it and on what it costs (the hard
    # miner was said to train many times slower, and nothing here spoke of time).
    miner_help = page.inner_text('[data-field="miner"] .help')
    assert "TripletMarginMiner" in miner_help and "A sweep stacks members that share a miner" in miner_help, \
        miner_help
    assert "semihard" in miner_help and "Default semihard" in miner_help, miner_help
    assert page.get_attribute("#f-margin", "placeholder") == "default 0.05"
    page.fill("#f-margin", "0.1")
    page.fill("#f-epochs", "1")
    page.click("#submit")
    page.wait_for_url("**/ui/experiments/*")
    eid = int(page.url.rsplit("/", 1)[1])
    spec = client.get(f"/experiments/{eid}").json()["spec"]
    assert spec["loss"] == "triplet" and spec["margin"] == 0.1 and spec["miner"] is None
    page.wait_for_selector("#kpi-prediction")
    assert page.inner_text("#kpi-prediction") == "nearest class mean"
    # What it trained on and in, once its first epoch is recorded (the shared worker may be busy
    # with other tests' runs first: make test's parallel pass timed out at 60 s once).
    page.wait_for_function("document.querySelector('#kpi-device').innerText === 'cpu · fp32'",
                           timeout=180_000)
    terms = page.locator("#spec dt").all_inner_texts()
    assert "margin" in terms and "lam" not in terms and "gamma" not in terms
    shot(page, "peer-loss-experiment")


def test_the_form_warns_of_gaussian_corel_below_lam_0_5_as_the_api_does(page, client):
    page.goto("/ui/new")
    page.wait_for_selector("#spec-form[data-ready=true]")
    page.select_option("#f-loss", "gaussian")
    page.fill("#f-lam", "0.3")
    assert "needs λ ≥ 0.5" in page.inner_text("#warn-lam")
    page.fill("#f-lam", "0.6")
    assert page.inner_text("#warn-lam") == ""
    page.fill("#f-lam", "0.3")
    page.select_option("#f-loss", "cosine")
    assert page.inner_text("#warn-lam") == ""
    page.select_option("#f-loss", "gaussian")
    assert page.inner_text("#warn-lam") != ""
    page.fill("#f-epochs", "1")
    page.click("#submit")
    page.wait_for_url("**/ui/experiments/*")
    page.wait_for_selector("#warning-box:not([hidden])")
    assert "Gaussian-COREL needs lam >= 0.5" in page.inner_text("#warning-box")


def test_a_dataset_uploaded_from_the_form_is_selected_and_trains(page, client, tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    path = tmp_path / "mine.npz"
    np.savez(path, x=digits.data[:400].astype(np.float32), y=digits.target[:400],
             class_names=np.array([f"digit {d}" for d in range(10)]))
    page.goto("/ui/new")
    page.wait_for_selector("#f-dataset_id")
    page.set_input_files("#upload-file", str(path))
    page.click("#upload-form button")
    page.wait_for_function("document.getElementById('upload-result').textContent.includes('is selected')")
    dataset_id = int(page.input_value("#f-dataset_id"))
    assert client.get(f"/datasets/{dataset_id}").json()["filename"] == "mine.npz"
    assert page.input_value("#f-dataset") == "npz"
    for field, value in (("epochs", "2"), ("lr", "0.003"), ("batch_size", "32")):
        page.fill(f"#f-{field}", value)
    page.click("#submit")
    page.wait_for_url("**/ui/experiments/*")
    experiment_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    body = wait_for(client, experiment_id, finished)
    assert body["status"] == "succeeded" and body["dataset_id"] == dataset_id, body
    page.wait_for_selector("#status .badge[data-status=succeeded]")


def test_a_file_uploaded_before_the_form_is_built_is_uploaded_not_submitted_with_the_page(page, client, tmp_path):
    """The form is built from /openapi.json; a file sent before that answers (held here) is
    uploaded, and selected once the form stands. The upload's handler was attached only after
    the page's fetches, so such a click submitted the page itself: a reload, nothing sent (a
    race the upload test above met under load)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    path = tmp_path / "early.npz"
    np.savez(path, x=digits.data[:100].astype(np.float32), y=digits.target[:100])
    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)

    page.route("**/openapi.json", hold)
    try:
        page.goto("/ui/new")
        deadline = time.monotonic() + 30
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        assert held, "the page did not ask for /openapi.json"
        assert page.locator("#f-dataset").count() == 0  # the form is not built yet
        page.set_input_files("#upload-file", str(path))
        with page.expect_response(lambda r: r.url.endswith("/datasets") and r.request.method == "POST",
                                  timeout=10_000) as sent:
            page.click("#upload-form button")
        assert sent.value.status == 201, sent.value.text()
        dataset_id = sent.value.json()["id"]
        assert page.inner_text("#upload-result") == "uploading…"  # selected once the form stands
        held[0].continue_()
        page.wait_for_function("document.getElementById('upload-result').textContent.includes('is selected')")
    finally:
        page.unroute("**/openapi.json", hold)
    assert page.input_value("#f-dataset") == "npz" and page.input_value("#f-dataset_id") == str(dataset_id)
    assert client.get(f"/datasets/{dataset_id}").json()["filename"] == "early.npz"
    assert "/ui/new" in page.url and "?" not in page.url  # not submitted with the page


def test_a_text_upload_trains_on_frozen_minilm_from_the_form_and_serves_sentences(page, client,
                                                                                  shared_datasets, tmp_path):
    """The form offers the pretrained encoders; a text table trained on frozen MiniLM with a
    Cosine-COREL head from it answers /embed, /predict and /neighbors on raw sentences."""
    import csv

    names = ["World", "Sports", "Business", "Sci/Tech"]
    with open(shared_datasets / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:200]
    path = tmp_path / "news.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["headline", "topic"])
        writer.writerows([f"{r[1]} {r[2]}", names[int(r[0]) - 1]] for r in rows)
    page.goto("/ui/new")
    page.wait_for_selector("#f-encoder")
    assert "minilm" in page.eval_on_selector_all("#f-encoder option", "os => os.map(o => o.value)")
    page.set_input_files("#upload-file", str(path))
    page.click("#upload-form button")
    page.wait_for_function("document.getElementById('upload-result').textContent.includes('is selected')")
    assert page.input_value("#f-dataset") == "text"
    page.select_option("#f-encoder", "minilm")
    page.select_option("#f-loss", "cosine")
    for field, value in (("lam", "0.85"), ("epochs", "15"), ("lr", "0.003"), ("batch_size", "32")):
        page.fill(f"#f-{field}", value)
    page.click("#submit")
    page.wait_for_url("**/ui/experiments/*")
    experiment_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    body = wait_for(client, experiment_id, finished, timeout=300)
    assert body["status"] == "succeeded" and body["spec"]["encoder"] == "minilm", body
    page.wait_for_selector("#status .badge[data-status=succeeded]")
    # The title names the encoder as GET /encoders declares it, and how it trained.
    page.wait_for_function("document.getElementById('subtitle').textContent.includes('frozen')")
    assert page.inner_text("#subtitle").startswith("Cosine-COREL λ 0.85 on text (all-MiniLM-L6-v2, frozen), seed")
    shot(page, "experiment-minilm")
    sentences = ["Stocks fell as the central bank raised interest rates",
                 "The striker scored twice in the cup final"]
    answers = page.evaluate("""async ([id, texts]) => {
        const post = async (url, body) => (await fetch(url, {method: "POST",
            headers: {"content-type": "application/json"}, body: JSON.stringify(body)})).json();
        return [await post("/embed", {experiment_id: id, texts}),
                await post("/predict", {experiment_id: id, texts}),
                await post(`/experiments/${id}/neighbors`, {texts, k: 3})];
    }""", [experiment_id, sentences])
    embedded, predicted, near = answers
    assert len(embedded["embeddings"]) == 2 and len(embedded["embeddings"][0]) == body["spec"]["hidden"]
    assert [p["class_name"] for p in predicted["predictions"]] == ["Business", "Sports"], predicted
    assert len(near["results"][0]["neighbors"]) == 3, near

    # The playground shows the warning of a text the model cannot read (none before), and
    # none for one it can.
    page.goto(f"/ui/playground?experiment_id={experiment_id}")
    page.wait_for_function("document.getElementById('latent').data !== undefined")
    assert page.is_visible("#text-input") and page.is_hidden("#rows-input")
    page.fill("#text", "")
    page.click("#predict-text")
    page.wait_for_selector("#warning", state="visible")
    warning = client.post("/predict", json={"experiment_id": experiment_id, "texts": [""]}).json()
    assert page.inner_text("#warning") == warning["predictions"][0]["warning"]
    page.fill("#text", sentences[1])
    page.click("#predict-text")
    page.wait_for_selector("#warning", state="hidden")
    assert page.inner_text("#prediction") == "Sports"
    # The playground's choice and the experiments list name the encoder, not the layers over it.
    chosen = page.eval_on_selector("#experiment", "s => s.options[s.selectedIndex].textContent")
    assert chosen.endswith("text (all-MiniLM-L6-v2, frozen)"), chosen
    page.goto("/?dataset=text&loss=cosine")
    page.wait_for_selector(f"#experiments tbody tr[data-id='{experiment_id}']")
    cells = page.eval_on_selector(f"#experiments tbody tr[data-id='{experiment_id}']",
                                  "r => [...r.cells].map(c => c.textContent)")
    assert "all-MiniLM-L6-v2, frozen" in cells and "ffnn" not in cells, cells
    shot(page, "experiments-encoder")


def test_the_experiment_page_shows_the_latent_scatter_and_the_clustering_table(page, client, trained):
    run = trained[0]
    page.goto(f"/ui/experiments/{run['id']}")
    page.wait_for_selector("#clustering tbody tr")
    assert page.inner_text("#subtitle").startswith("Gaussian-COREL λ 0.85 on digits (ffnn), seed")
    page.wait_for_function("document.getElementById('latent').data !== undefined")
    traces = page.evaluate("document.getElementById('latent').data.map(t => ({name: t.name, n: t.x.length}))")
    scatter = client.get(f"/experiments/{run['id']}/latent/scatter").json()
    assert sum(t["n"] for t in traces if t["name"] != "class vectors W") == len(scatter["points"])
    assert next(t for t in traces if t["name"] == "class vectors W")["n"] == len(scatter["class_names"])
    report = client.get(f"/experiments/{run['id']}/clustering").json()["results"]
    for algorithm, scores in report.items():
        row = page.locator(f"#clustering tr[data-algorithm='{algorithm}'] td")
        assert row.nth(2).inner_text() == f"{100 * scores['accuracy']:.2f}"
        assert row.nth(3).inner_text() == f"{scores['ari']:.3f}"
    page.wait_for_selector("#retrieval tbody tr")
    retrieval = client.get(f"/experiments/{run['id']}/retrieval").json()
    assert page.inner_text("#ret-map") == f"{100 * retrieval['mean_average_precision_at_r']:.2f}"
    assert page.inner_text("#ret-p1") == f"{100 * retrieval['precision_at_1']:.2f}"
    shot(page, "experiment")


def test_two_runs_compared(page, trained):
    a, b = trained[0]["id"], trained[1]["id"]
    page.goto(f"/ui/compare?ids={a},{b}")
    page.wait_for_selector("#compare-table tbody tr")
    assert page.locator("#compare-table tbody tr").count() == 2
    assert page.evaluate("document.getElementById('val-curves').data.length") == 2
    assert page.locator(f"#compare-table tr[data-id='{b}']").inner_text().count("cosine") >= 1
    shot(page, "compare")


def _digit_png() -> tuple[bytes, int]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    i = 1500  # in the digits test split or not, any digit will do
    image = (digits.images[i] * (255 / 16)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image).resize((64, 64), Image.Resampling.NEAREST).save(buf, format="PNG")
    return buf.getvalue(), int(digits.target[i])


def test_the_playground_predicts_an_uploaded_image(page, client, trained, tmp_path):
    run = trained[0]
    data, _ = _digit_png()
    path = tmp_path / "digit.png"
    path.write_bytes(data)
    expected = client.post("/predict", json={"experiment_id": run["id"],
                                             "images": [base64.b64encode(data).decode()]}).json()
    page.goto(f"/ui/playground?experiment_id={run['id']}")
    page.wait_for_function("document.getElementById('latent').data !== undefined")
    page.set_input_files("#file", str(path))
    page.wait_for_function("document.getElementById('prediction').dataset.classIndex !== undefined")
    assert page.inner_text("#prediction") == expected["predictions"][0]["class_name"]
    bars = page.evaluate("document.getElementById('similarities').data[0].y")
    np.testing.assert_allclose(bars, expected["predictions"][0]["similarities"], rtol=1e-5, atol=1e-6)
    names = page.evaluate("document.getElementById('latent').data.map(t => t.name)")
    assert "your input" in names
    # Its nearest training rows, as /neighbors answers for the same image.
    page.wait_for_selector("#neighbors tbody tr")
    nn = client.post(f"/experiments/{run['id']}/neighbors",
                     json={"images": [base64.b64encode(data).decode()], "k": 10}).json()
    rows = page.evaluate("[...document.querySelectorAll('#neighbors tbody tr')].map(r => +r.dataset.row)")
    assert rows == [n["row"] for n in nn["results"][0]["neighbors"]]
    assert nn["results"][0]["knn_prediction"]["class_name"] in page.inner_text("#neighbors-note")
    # Each shown by its id and its image (it showed row numbers alone).
    ids = page.evaluate("[...document.querySelectorAll('#neighbors tbody tr')].map(r => +r.cells[1].textContent)")
    assert ids == [n["id"] for n in nn["results"][0]["neighbors"]]
    page.wait_for_function("[...document.querySelectorAll('#neighbors img.thumb')]"
                           ".every(i => i.complete && i.naturalWidth > 0)")
    assert page.evaluate("document.querySelectorAll('#neighbors img.thumb').length") == 10
    shot(page, "playground")


def test_the_experiments_list_shows_a_running_row_s_phase(page, client, shared_datasets):
    """The list showed `running` alone while a run computed its features for minutes; its
    page showed the phase. The row shows it too, naming the split, with one count over the
    dataset."""
    import csv

    with open(shared_datasets / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:3000]
    table = "text,label\n" + "".join(f'"{r[1]} {r[2]} (the list shows its phase)",{r[0]}\n'
                                      for r in rows if '"' not in r[1] + r[2])
    up = client.post("/datasets", files={"file": ("phase-news.csv", table.encode())}, data={"kind": "text"})
    assert up.status_code == 201, up.text
    eid = client.post("/experiments", json={"dataset": "text", "dataset_id": up.json()["id"], "encoder": "minilm",
                                            "precision": "fp32", "loss": "cosine", "epochs": 2}).json()["id"]
    try:
        page.goto("/")
        page.wait_for_function(
            f"(document.querySelector('tr[data-id=\"{eid}\"] .row-phase') || {{}}).textContent?.includes('split) features of')",
            timeout=120_000)
        shown = page.inner_text(f"tr[data-id='{eid}'] .row-phase")
        assert shown.startswith("computing features: minilm (train split) features of "), shown
        assert shown.endswith(" rows") and " of " in shown, shown
    finally:
        client.post(f"/experiments/{eid}/cancel")
    assert wait_for(client, eid, finished)["status"] == "cancelled"
    page.wait_for_function(f"document.querySelector('tr[data-id=\"{eid}\"]').dataset.status === 'cancelled'")
    assert page.query_selector(f"tr[data-id='{eid}'] .row-phase") is None


def test_the_playground_offers_a_cancelled_run_that_serves_marked_as_such(page, client, trained, tmp_path):
    """It offered succeeded runs only; a run cancelled after an epoch serves (and, cancelled
    alone, has its latent spaces), so it is offered, marked cancelled with its best epoch."""
    eid = client.post("/experiments", json={**FAST, "loss": "cosine", "lam": 0.8, "epochs": 300}).json()["id"]
    wait_for(client, eid, lambda b: b["current_epoch"] >= 1 or finished(b))
    assert client.post(f"/experiments/{eid}/cancel").status_code == 200
    body = wait_for(client, eid, finished)
    assert body["status"] == "cancelled" and body["best_epoch"] >= 1, body
    page.goto(f"/ui/playground?experiment_id={eid}")
    page.wait_for_function("document.getElementById('latent').data !== undefined")
    label = page.inner_text(f"#experiment option[value='{eid}']")
    assert label.endswith(f"cancelled: best epoch {body['best_epoch']}"), label
    succeeded = page.inner_text(f"#experiment option[value='{trained[0]['id']}']")
    assert "cancelled" not in succeeded and "pruned" not in succeeded, succeeded
    assert page.input_value("#experiment") == str(eid)
    assert "cancelled early" in page.inner_text("#exp-note")
    data, _ = _digit_png()
    (tmp_path / "digit.png").write_bytes(data)
    page.set_input_files("#file", str(tmp_path / "digit.png"))
    page.wait_for_function("document.getElementById('prediction').dataset.classIndex !== undefined")
    expected = client.post("/predict", json={"experiment_id": eid, "images": [base64.b64encode(data).decode()]})
    assert page.inner_text("#prediction") == expected.json()["predictions"][0]["class_name"]
    # Its own page links it to the playground, as a succeeded run's does.
    page.goto(f"/ui/experiments/{eid}")
    page.wait_for_selector("#playground-link:not([hidden])")


def test_the_playground_takes_feature_rows_and_a_csv_for_a_feature_table_model(page, client,
                                                                              worker, tmp_path):
    """A model trained from a table of numbers reads rows, not images: the playground offers a
    CSV box headed by the model's columns and a CSV file (it offered image drop and drawing,
    then failed), and shows what /predict answers for the same rows."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    columns = ["sepal length", "sepal width", "petal length", "petal width"]
    lines = [",".join([*columns, "species"])] + [
        ",".join([*(f"{v:g}" for v in x), iris.target_names[t]])
        for x, t in zip(iris.data, iris.target, strict=True)]
    ds = client.post("/datasets", files={"file": ("iris.csv", "\n".join(lines).encode())})
    assert ds.status_code == 201, ds.text
    r = client.post("/experiments", json={"dataset": "npz", "dataset_id": ds.json()["id"],
                                          "budget": "quick", "loss": "gaussian", "lam": 0.5})
    body = wait_for(client, r.json()["id"], finished)
    assert body["status"] == "succeeded", body
    page.goto(f"/ui/playground?experiment_id={body['id']}")
    page.wait_for_function("document.getElementById('latent').data !== undefined")
    assert page.is_hidden("#image-input") and page.is_hidden("#text-input")
    assert page.is_visible("#rows-input")
    assert page.input_value("#rows") == ",".join(columns) + "\n"

    # Two rows typed under the header, in another column order than the table's.
    typed = ("petal width,petal length,sepal width,sepal length\n"
             "0.2,1.4,3.5,5.1\n2.3,5.4,3.1,6.9\n")
    page.fill("#rows", typed)
    page.click("#predict-rows")
    page.wait_for_function("document.getElementById('prediction').dataset.classIndex !== undefined")
    rows = [dict(zip(["petal width", "petal length", "sepal width", "sepal length"],
                     map(float, line.split(",")), strict=True)) for line in typed.splitlines()[1:]]
    expected = client.post("/predict", json={"experiment_id": body["id"], "rows": rows}).json()
    assert page.inner_text("#prediction") == expected["predictions"][0]["class_name"]
    shown = page.evaluate("[...document.querySelectorAll('#row-predictions tbody tr')]"
                          ".map(r => [r.cells[0].textContent, r.cells[1].textContent])")
    assert shown == [[f"rows.csv, row {i}", p["class_name"]]
                     for i, p in enumerate(expected["predictions"], 1)]
    bars = page.evaluate("document.getElementById('similarities').data[0].y")
    np.testing.assert_allclose(bars, expected["predictions"][0]["similarities"], rtol=1e-5, atol=1e-6)
    marks = page.evaluate("document.getElementById('latent').data.find(t => t.name === 'your input').x.length")
    assert marks == 2
    page.wait_for_selector("#neighbors tbody tr")

    # A CSV file (semicolons, and a label column the model ignores) predicts its rows.
    path = tmp_path / "new flowers.csv"
    path.write_text("species;" + ";".join(columns) + "\n?;6.3;3.3;6.0;2.5\n?;5.0;3.4;1.5;0.2\n"
                    "?;5.9;3.0;4.2;1.5\n")
    page.evaluate("document.getElementById('prediction').removeAttribute('data-class-index')")
    page.set_input_files("#csv-file", str(path))
    page.wait_for_function("document.querySelectorAll('#row-predictions tbody tr').length === 3")
    files = [("files", ("new flowers.csv", path.read_bytes(), "text/csv"))]
    expected = client.post("/predict", data={"experiment_id": str(body["id"])}, files=files).json()
    shown = page.evaluate("[...document.querySelectorAll('#row-predictions tbody tr')]"
                          ".map(r => [r.cells[0].textContent, r.cells[1].textContent])")
    assert shown == [[p["input"], p["class_name"]] for p in expected["predictions"]]
    shot(page, "playground-rows")

    # A row short of a column is refused by the server, and the page says so.
    page.fill("#rows", ",".join(columns[:3]) + "\n5.1,3.5,1.4\n")
    page.click("#predict-rows")
    page.wait_for_function("document.body.innerText.includes(\"no value for feature column(s) 'petal width'\")")


def test_a_sweep_page_shows_progress_and_the_tables(page, client, worker):
    body = {"base": {**FAST, "epochs": 4}, "grid": {"loss": ["cce", "gaussian"], "lam": [0.6, 0.85],
                                                    "seed": [0, 1]}}
    r = client.post("/sweeps", json=body)
    assert r.status_code == 202, r.text
    sweep_id = r.json()["id"]
    page.goto(f"/ui/sweeps/{sweep_id}")
    page.wait_for_selector("#members tbody tr")
    assert page.locator("#members tbody tr").count() == r.json()["size"]
    # Which members trained together: each row's stacked group, as the answer grouped them.
    groups = r.json()["member_groups"]
    assert f"{r.json()['size']} members in {len(groups)} stacked groups" in page.inner_text("#stacks")
    shown_stacks = page.evaluate("Object.fromEntries([...document.querySelectorAll('#members tbody tr')]"
                                 ".map(r => [r.dataset.id, +r.querySelector('[data-stack]').dataset.stack]))")
    assert shown_stacks == {str(i): g + 1 for g, ids in enumerate(groups) for i in ids}, (shown_stacks, groups)
    page.wait_for_function("document.querySelectorAll('#members tr[data-status=succeeded]').length === "
                           f"{r.json()['size']}", timeout=180_000)
    report = client.get(f"/sweeps/{sweep_id}/report").json()
    best = report["test_accuracy"]["rows"][0]
    # The tables follow the members as they finish (a second after the last one).
    page.wait_for_function(
        f"(document.querySelector(\"#table1 tr[data-loss='{best['loss']}'] td:nth-child(3)\") || {{}})"
        f".textContent === '{100 * best['mean']:.2f}'", timeout=15_000)
    assert page.locator("#table1 tbody tr").count() == len(report["test_accuracy"]["rows"])
    assert page.locator("#table34 tbody tr").count() == len(report["clustering"])
    assert "paired two-tailed t-test over 2 seeds" in page.inner_text("#ttest")
    assert page.evaluate("document.getElementById('lambda-plot').data.length") == 2
    rows = report["retrieval"]["rows"]
    assert page.locator("#table-map tbody tr").count() == len(rows) > 0
    first = page.locator(f"#table-map tr[data-loss='{rows[0]['loss']}'] td").nth(2).inner_text()
    assert first == f"{100 * rows[0]['mean']:.2f}"
    # Each table's t-test speaks of its own figure (under MAP@R it said "best mean test accuracy").
    assert "has the best mean test accuracy" in page.inner_text("#ttest")
    assert "has the best mean MAP@R" in page.inner_text("#ttest-map"), page.inner_text("#ttest-map")
    # Under the live updates the page ends as the API says: every member, each with its status,
    # and the count beside them (it once said "12 of 12 done" beside 11 members until reloaded).
    api = client.get("/experiments", params={"sweep_id": sweep_id, "limit": 200}).json()["items"]
    page.wait_for_function(f"document.querySelector('#sweep-progress em').textContent === '{len(api)} of {len(api)} done'")
    shown = page.evaluate("[...document.querySelectorAll('#members tbody tr')].map(r => [+r.dataset.id, r.dataset.status])")
    assert sorted(shown) == sorted([e["id"], e["status"]] for e in api), (shown, api)
    assert _no_row_cut(page, "#members")
    shot(page, "sweep")
    page.goto("/ui/sweeps")
    page.wait_for_selector(f"#sweeps tr[data-id='{sweep_id}']")
    assert page.inner_text(f"#sweeps tr[data-id='{sweep_id}'] td.loss") == "CCE, Gaussian-COREL"


def test_a_pruned_sweep_page_shows_its_rungs_and_the_grid_in_parallel_coordinates(page, client, worker):
    body = {"base": {**FAST, "loss": "cosine", "epochs": 4}, "grid": {"lam": [0.1, 0.3, 0.5, 0.7, 0.85, 0.95]},
            "prune": {"metric": "val_accuracy", "eta": 3, "min_epochs": 1}}
    r = client.post("/sweeps", json=body)
    assert r.status_code == 202, r.text
    sweep_id = r.json()["id"]
    page.goto(f"/ui/sweeps/{sweep_id}")
    page.wait_for_function("document.querySelectorAll('#members tr[data-status=pruned]').length === 5",
                           timeout=180_000)
    report = client.get(f"/sweeps/{sweep_id}/report").json()["pruning"]
    page.wait_for_function(f"document.querySelectorAll('#rungs tbody tr').length === {len(report['rungs'])}",
                           timeout=15_000)
    shown = page.evaluate("[...document.querySelectorAll('#rungs tbody tr')].map(r => [...r.cells].map(c => +c.textContent))")
    assert shown == [[r["epoch"], r["members"], r["kept"]] for r in report["rungs"]] == [[1, 6, 2], [3, 2, 1]]
    page.wait_for_function("document.querySelectorAll('#pruned tbody tr').length === 5")
    assert "pruned" in page.inner_text("#members") and not page.locator("#pruning-box").is_hidden()
    # The grid as parallel coordinates: lambda, then best val % and test %, one line per member.
    page.wait_for_function("(document.getElementById('parcoords').data || []).length === 1")
    dims = page.evaluate("document.getElementById('parcoords').data[0].dimensions.map(d => [d.label, d.values.length])")
    assert dims == [["λ", 6], ["best val %", 6], ["test %", 6]], dims
    assert page.evaluate("document.getElementById('parcoords').data[0].type") == "parcoords"
    # The lambda plot shows the pruned members too (it showed the survivor alone), as points of
    # their own at their best validation accuracy up to their rung.
    members = client.get("/experiments", params={"sweep_id": sweep_id, "limit": 200}).json()["items"]
    pruned = sorted((m["spec"]["lam"], m["best_val_accuracy"]) for m in members if m["status"] == "pruned")
    # The page redraws the plot a second after a member ends, from the members it has heard of
    # by then: the last one pruned may come in the next redraw (CI once read the plot between).
    page.wait_for_function("(document.getElementById('lambda-plot').data || [])"
                           f".some(t => t.name.startsWith('pruned') && t.x.length === {len(pruned)})", timeout=15_000)
    plotted = page.evaluate("(t => t.x.map((x, i) => [x, t.y[i]]))(document.getElementById('lambda-plot').data"
                            ".find(t => t.name.startsWith('pruned')))")
    assert sorted(map(tuple, plotted)) == pruned, (plotted, pruned)
    assert _no_row_cut(page, "#pruned") and _no_row_cut(page, "#members")
    shot(page, "sweep-pruned")


def test_a_fewshot_sweep_page_plots_accuracy_against_shots_with_error_bars(page, client, worker):
    """Issue 71: a few-shot sweep's page shows each method's mean test accuracy against N with
    its sd over the draws as error bars, and the table of the report; the paper's tables, which
    a few-shot sweep has none of, are not shown."""
    r = client.post("/sweeps", json={"base": {"dataset": "digits"}, "grid": {"loss": ["cosine", "cce"]},
                                     "fewshot": {"shots": [2, 4], "splits": 2}})
    assert r.status_code == 202, r.text
    sweep_id = r.json()["id"]
    page.goto(f"/ui/sweeps/{sweep_id}")
    page.wait_for_function("document.querySelectorAll('#members tr[data-status=succeeded]').length === 8",
                           timeout=180_000)
    report = client.get(f"/sweeps/{sweep_id}/report").json()["fewshot"]
    assert len(report["summary"]) == 4
    # The page redraws a second after a member ends: until then it may show a draw fewer.
    page.wait_for_function("[...document.querySelectorAll('#fewshot-table tbody tr td:last-child')]"
                           ".map(td => td.textContent).join() === '2,2,2,2'", timeout=15_000)
    assert not page.locator("#fewshot-box").is_hidden() and page.locator("#report-box").is_hidden()
    assert "few-shot: N = 2, 4, 2 draws each" in page.inner_text("#subtitle")
    page.wait_for_function("(document.getElementById('fewshot-plot').data || []).length === 2")
    traces = page.evaluate("document.getElementById('fewshot-plot').data.map(t => [t.name, t.x, t.y, t.error_y.array])")
    want = {m: sorted((row["shots"], 100 * row["mean"], 100 * row["sd"]) for row in report["summary"] if row["method"] == m)
            for m in ("cosine", "cce")}
    names = {"cosine": "Cosine-COREL", "cce": "CCE"}
    for name, x, y, err in traces:
        method = next(m for m, shown in names.items() if shown == name)
        assert [(a, pytest.approx(b), pytest.approx(c)) for a, b, c in zip(x, y, err, strict=True)] == want[method]
    best = next(row for row in report["summary"] if row["shots"] == 4 and row["method"] == row["best"])
    cells = page.locator(f"#fewshot-table tr[data-shots='4'][data-method='{best['method']}'] td")
    assert cells.nth(1).inner_text().endswith("★") and cells.nth(2).inner_text() == f"{100 * best['mean']:.2f}"
    shot(page, "sweep-fewshot")


def _no_row_cut(page: Any, table: str) -> bool:
    """No row of a scrolled table's box is cut across by the box's bottom edge."""
    return page.evaluate("""(sel) => {
      const table = document.querySelector(sel), box = table.parentElement.getBoundingClientRect();
      return [...table.querySelectorAll('tbody tr')].every((tr) => {
        const r = tr.getBoundingClientRect();
        return r.bottom <= box.bottom + 1 || r.top >= box.bottom - 1;
      });
    }""", table)


def test_the_sweeps_list_names_a_sweep_s_loss_given_in_its_base(page, client):
    """The list showed the grid (seed: 0, 1), and not the loss every member trained."""
    r = client.post("/sweeps", json={"base": {**FAST, "epochs": 1, "loss": "triplet", "miner": "hard"},
                                     "grid": {"seed": [0, 1]}})
    assert r.status_code == 202, r.text
    sweep_id = r.json()["id"]
    client.post(f"/sweeps/{sweep_id}/cancel")
    page.goto("/ui/sweeps")
    page.wait_for_selector(f"#sweeps tr[data-id='{sweep_id}']")
    assert page.inner_text(f"#sweeps tr[data-id='{sweep_id}'] td.loss") == "Triplet"


def _sweep_form(page: Any, epochs: str, lambdas: str, metric: str, eta: str, min_epochs: str) -> None:
    """The sweeps page's form filled for Cosine-COREL on digits, pruned, one seed."""
    page.goto("/ui/sweeps")
    page.wait_for_selector("#sweep-form[data-ready=true]")
    page.select_option("#s-dataset", "digits")
    page.check("#s-losses input[value=cosine]")
    page.fill("#s-lambdas", lambdas)
    page.fill("#s-seeds", "0")
    page.fill("#s-epochs", epochs)
    assert page.is_disabled("#s-prune-eta")  # off until pruning is asked for
    page.check("#s-prune")
    page.select_option("#s-prune-metric", metric)
    page.fill("#s-prune-eta", eta)
    page.fill("#s-prune-min_epochs", min_epochs)


def test_a_pruned_sweep_created_from_the_sweeps_form_lands_on_its_page_and_prunes(page, client, worker):
    _sweep_form(page, epochs="3", lambdas="0.3, 0.6, 0.9", metric="val_accuracy", eta="3", min_epochs="1")
    shot(page, "new-sweep")
    page.click("#sweep-submit")
    page.wait_for_url("**/ui/sweeps/*")
    sweep_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    body = client.get(f"/sweeps/{sweep_id}").json()
    assert body["prune"] == {"metric": ["val_accuracy"], "eta": 3, "min_epochs": 1}, body
    assert body["base"] == {"dataset": "digits", "budget": "quick", "epochs": 3, "loss": "cosine"}, body
    assert body["grid"] == {"lam": [0.3, 0.6, 0.9], "seed": [0]} and body["size"] == 3, body
    # One rung, at epoch 1: of the three λ the best third stays, the other two end pruned.
    page.wait_for_function("document.querySelectorAll('#members tr[data-status=pruned]').length === 2",
                           timeout=120_000)
    page.wait_for_selector("#pruning-box:not([hidden]) #pruned tbody tr", timeout=15_000)
    assert "epoch 1, then times 3" in page.inner_text("#pruning-note")


def test_a_sweep_the_server_refuses_shows_its_422_beside_the_form_without_leaving_the_page(page, client):
    before = client.get("/sweeps", params={"limit": 1}).json()["total"]
    _sweep_form(page, epochs="3", lambdas="0.3, 0.6", metric="both", eta="1", min_epochs="1")
    page.click("#sweep-submit")
    page.wait_for_selector('.field.invalid[data-field="prune.eta"]')
    assert "prune.eta: Input should be greater than or equal to 2" in page.inner_text("#serr-prune-eta")
    assert page.inner_text("#serr-prune-metric") == ""  # "both" went as the list the API takes
    shot(page, "new-sweep-invalid")
    # One of the sweep's own checks (no field list, its field named in the sentence).
    page.fill("#s-prune-eta", "3")
    page.fill("#s-prune-min_epochs", "3")
    page.click("#sweep-submit")
    page.wait_for_function("document.getElementById('serr-prune-min_epochs').textContent !== ''")
    assert "prune.min_epochs is 3, but the runs train 3 epochs" in page.inner_text("#serr-prune-min_epochs")
    assert page.inner_text("#serr-prune-eta") == ""
    assert page.url.endswith("/ui/sweeps")
    assert client.get("/sweeps", params={"limit": 1}).json()["total"] == before


def test_the_experiments_table_filters_and_pages(page, client, trained):
    page.goto("/")
    page.wait_for_selector("#experiments tbody tr[data-id]")
    total = client.get("/experiments", params={"limit": 1}).json()["total"]
    assert f"of {total}" in page.inner_text("#page-info")
    page.select_option("#filters select[name=loss]", "cosine")
    page.wait_for_function("[...document.querySelectorAll('#experiments tbody tr[data-id]')]"
                           ".every(tr => tr.children[6].textContent === 'Cosine-COREL')")
    cosine = client.get("/experiments", params={"loss": "cosine", "limit": 1}).json()["total"]
    assert f"of {cosine}" in page.inner_text("#page-info")
    page.select_option("#filters select[name=loss]", "")
    page.wait_for_function(f"document.getElementById('page-info').textContent.includes('of {total}')")
    shot(page, "experiments")


def test_a_run_is_cancelled_then_deleted_from_the_table(page, client, worker):
    long_run = client.post("/experiments", json={**FAST, "epochs": 2000}).json()["id"]
    page.on("dialog", lambda dialog: dialog.accept())  # "Delete experiment N ...?"
    page.goto("/")
    row = f"#experiments tr[data-id='{long_run}']"
    page.click(f"{row} button[data-action=cancel]")
    body = wait_for(client, long_run, finished)
    assert body["status"] == "cancelled", body
    page.wait_for_selector(f"{row}[data-status=cancelled] button[data-action=delete]")
    page.click(f"{row} button[data-action=delete]")
    page.wait_for_selector(row, state="detached")
    assert client.get(f"/experiments/{long_run}").status_code == 404


@pytest.mark.own_auth
def test_with_a_token_the_dashboard_asks_once_and_sends_it(browser, settings, worker):
    secured = settings.model_copy(update={"api_token": SecretStr("s3cret-for-the-tab")})
    with serving(create_app(secured)) as url:
        context = browser.new_context(base_url=url)
        page = context.new_page()
        page.goto("/")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", "wrong")
        page.click("#token-form button")
        page.wait_for_selector("#token-dialog[open]")
        assert "refused" in page.inner_text("#token-error")
        page.fill("#token-input", "s3cret-for-the-tab")
        page.click("#token-form button")
        page.wait_for_selector("#experiments tbody tr")
        assert page.evaluate("sessionStorage.getItem('corel-api-token')") == "s3cret-for-the-tab"
        page.goto("/ui/sweeps")  # another page of the same tab: no second question
        page.wait_for_selector("#sweeps tbody tr")
        assert not page.locator("#token-dialog[open]").count()
        context.close()


def test_the_api_docs_render_offline(page, live):
    """/docs and /redoc load their scripts and styles from the service itself: with every
    request to another host refused (as offline), both render the API (they were blank).
    Only an image may come from elsewhere (ReDoc's footer logo; offline it is not shown)."""
    elsewhere = _offline(page, live, images_allowed=True)  # ReDoc's "powered by" logo, say
    page.goto("/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=20_000)
    assert "corel" in page.inner_text(".swagger-ui .info .title")
    page.wait_for_selector("#operations-experiments-create_experiments_post", timeout=20_000)
    page.goto("/redoc")
    page.wait_for_selector("h1", timeout=20_000)
    assert "corel" in page.inner_text("h1")
    assert not elsewhere, elsewhere


def _offline(page: Any, live: str, images_allowed: bool = False) -> list[str]:
    """Refuse every request to another host, as offline; returns those that were tried
    (besides images, when ``images_allowed``: refused all the same, but not counted)."""
    host = live.split("//", 1)[1]
    elsewhere: list[str] = []

    def only_here(route: Any) -> None:
        if route.request.url.split("//", 1)[1].startswith(host):
            route.continue_()
        else:
            if not (images_allowed and route.request.resource_type == "image"):
                elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_here)
    return elsewhere


@pytest.mark.parametrize("dataset", ["mnist", "ag-news"])
def test_mnist_and_ag_news_train_from_the_form_offline(page, live, client, dataset):
    """The datasets the form offers train from it, with no other host reachable: MNIST
    and AG News from ../shared/datasets, as `make serve` sets COREL_DATA_DIR."""
    require(SHARED_DATASETS.is_dir(), "../shared/datasets")
    elsewhere = _offline(page, live)
    page.goto("/ui/new")
    page.wait_for_selector("#spec-form[data-ready=true]")
    option = page.locator(f'#f-dataset option[value="{dataset}"]')
    assert option.get_attribute("disabled") is None and option.inner_text() == dataset
    page.select_option("#f-dataset", dataset)
    for field, value in (("epochs", "1"), ("lr", "0.001"), ("batch_size", "64"),
                         ("train_subset", "600")):
        page.fill(f"#f-{field}", value)
    page.click("#submit")
    page.wait_for_url("**/ui/experiments/*")
    experiment_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    page.wait_for_selector('#status .badge[data-status="succeeded"]', timeout=240_000)
    body = client.get(f"/experiments/{experiment_id}").json()
    assert body["status"] == "succeeded" and body["spec"]["dataset"] == dataset, body
    chance = {"mnist": 0.1, "ag-news": 0.25}[dataset]
    assert body["test_accuracy"] > chance + 0.07, body  # one epoch on 600 rows: above chance
    page.wait_for_selector("#latent .main-svg", timeout=30_000)
    shot(page, f"form-{dataset}")
    assert not elsewhere, elsewhere


def test_with_downloads_off_and_no_files_the_form_marks_them_unavailable(browser, settings,
                                                                          tmp_path):
    bare = settings.model_copy(update={"data_dir": str(tmp_path / "empty"),
                                       "var_dir": tmp_path / "var", "download": False})
    with serving(create_app(bare)) as url:
        context = browser.new_context(base_url=url)
        page = context.new_page()
        page.goto("/ui/new")
        page.wait_for_selector("#spec-form[data-ready=true]")
        for dataset in ("mnist", "ag-news"):
            option = page.locator(f'#f-dataset option[value="{dataset}"]')
            assert option.get_attribute("disabled") is not None
            assert option.inner_text() == f"{dataset} (unavailable: see COREL_DATA_DIR)"
            assert "COREL_DATA_DIR" in option.get_attribute("title")
        for dataset in ("fashion-mnist", "digits"):
            assert page.locator(f'#f-dataset option[value="{dataset}"]').get_attribute(
                "disabled") is None
        context.close()
    # Downloads on, from a mirror that has MNIST (the shared folder's layout, <dataset>/<file>).
    require((SHARED_DATASETS / "mnist").is_dir(), "MNIST in ../shared/datasets")
    mirror = Mirror(SHARED_DATASETS)
    downloads = settings.model_copy(update={"data_dir": str(tmp_path / "empty"),
                                            "var_dir": tmp_path / "var2", "download": True,
                                            "download_mirror": mirror.url})
    try:
        with serving(create_app(downloads)) as url:
            context = browser.new_context(base_url=url)
            page = context.new_page()
            page.goto("/ui/new")
            page.wait_for_selector("#spec-form[data-ready=true]")
            option = page.locator('#f-dataset option[value="mnist"]')
            assert option.get_attribute("disabled") is None
            assert option.inner_text() == "mnist (downloaded on its first run)"
            context.close()
    finally:
        mirror.close()


def test_a_run_that_failed_before_its_first_epoch_says_so_instead_of_an_empty_chart(
    page, settings
):
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from app.core.models import Experiment, utcnow

    engine = create_engine(settings.database_url)
    with Session(engine) as session:
        exp = Experiment(status="failed", spec={**FAST, "loss": "cosine", "lam": 0.7, "seed": 0,
                                                "epochs": 5},
                         dataset="digits", loss="cosine", epochs_total=5, finished_at=utcnow(),
                         error="DownloadError: could not download t10k-images-idx3-ubyte.gz")
        session.add(exp)
        session.commit()
        experiment_id = exp.id
    engine.dispose()
    page.goto(f"/ui/experiments/{experiment_id}")
    page.wait_for_selector("#curves-note:not([hidden])")
    assert "before its first epoch" in page.inner_text("#curves-note")
    assert not page.locator("#curves").is_visible()
    assert "DownloadError" in page.inner_text("#error-box")
    assert page.inner_text("#latent-note") == "None: the experiment failed."
    shot(page, "experiment-failed-early")


# --- users, owners, sharing and the audit log (issue 25) --------------------------------
# On a server of their own (SQLite): users created here must not end the open mode of the
# suite's shared database.

TEAM_ADMIN = "team-bootstrap-s3cret"


@pytest.fixture
def team(tmp_path) -> Iterator[dict[str, Any]]:
    """A served app with COREL_API_TOKEN and three users: ann and bob (write tokens) and
    root (an admin token); ann owns an experiment, a sweep and an upload, bob and the
    bootstrap admin an experiment each."""
    import httpx

    from app.core.migrate import upgrade
    from app.core.settings import Settings

    s = Settings(database_url=f"sqlite:///{tmp_path / 'team.sqlite3'}", var_dir=tmp_path,
                 broker_url="memory://", log_level="WARNING", api_token=SecretStr(TEAM_ADMIN))
    upgrade(s)
    with serving(create_app(s)) as url, httpx.Client(base_url=url, timeout=30) as c:
        boot = {"Authorization": f"Bearer {TEAM_ADMIN}"}
        team: dict[str, Any] = {"url": url, "client": c, "admin": TEAM_ADMIN, "contexts": []}
        for name, scope in (("ann", "write"), ("bob", "write"), ("root", "admin")):
            uid = c.post("/users", json={"name": name, "admin": scope == "admin"}, headers=boot).json()["id"]
            token = c.post(f"/users/{uid}/tokens", json={"scope": scope}, headers=boot).json()["token"]
            team[name] = {"id": uid, "token": token, "auth": {"Authorization": f"Bearer {token}"}}
        ann, bob = team["ann"]["auth"], team["bob"]["auth"]
        team["ann_run"] = c.post("/experiments", json={**FAST, "epochs": 1}, headers=ann).json()["id"]
        team["bob_run"] = c.post("/experiments", json={**FAST, "epochs": 1}, headers=bob).json()["id"]
        team["boot_run"] = c.post("/experiments", json={**FAST, "epochs": 1}, headers=boot).json()["id"]
        r = c.post("/sweeps", json={"base": {**FAST, "epochs": 1}, "grid": {"seed": [0, 1]}}, headers=ann)
        team["ann_sweep"] = r.json()["id"]
        y = np.arange(60) % 3
        x = (np.random.default_rng(0).normal(size=(60, 4)) + 3 * np.eye(3, 4)[y]).astype(np.float32)
        r = c.post("/datasets", files={"file": ("ann-blobs.npz", npz_bytes(x=x, y=y))}, headers=ann)
        assert r.status_code == 201, r.text
        team["ann_upload"] = r.json()["id"]
        yield team
        for context in team["contexts"]:
            context.close()


def _as(browser: Any, team: dict[str, Any], token: str) -> Any:
    """A page of the team's server whose tab holds ``token`` (as if typed in the dialog)."""
    context = browser.new_context(viewport={"width": 1360, "height": 900}, base_url=team["url"])
    team["contexts"].append(context)
    context.add_init_script(f"sessionStorage.setItem('corel-api-token', {token!r})")
    pg = context.new_page()
    pg.errors = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    return pg


@pytest.mark.own_auth
def test_the_lists_show_each_row_s_owner(browser, team):
    pg = _as(browser, team, team["admin"])
    pg.goto("/")
    pg.wait_for_selector(f'#experiments tbody tr[data-id="{team["boot_run"]}"]')
    owner = {i: pg.inner_text(f'#experiments tr[data-id="{i}"] td.owner')
             for i in (team["ann_run"], team["bob_run"], team["boot_run"])}
    assert owner == {team["ann_run"]: "ann", team["bob_run"]: "bob", team["boot_run"]: "unowned"}
    # The header is filled from its own GET /me, which may land after the list.
    pg.wait_for_selector("#whoami:not([hidden])")
    assert "bootstrap admin · admin" in pg.inner_text("#whoami")
    shot(pg, "owners-experiments")
    pg.goto("/ui/sweeps")
    pg.wait_for_selector(f'#sweeps tbody tr[data-id="{team["ann_sweep"]}"]')
    assert pg.inner_text(f'#sweeps tr[data-id="{team["ann_sweep"]}"] td.owner') == "ann"
    pg.goto("/ui/datasets")
    pg.wait_for_selector(f'#datasets tbody tr[data-id="{team["ann_upload"]}"]')
    assert pg.inner_text(f'#datasets tr[data-id="{team["ann_upload"]}"] td.owner') == "ann"
    shot(pg, "owners-uploads")
    # bob sees his own run only: ann's is private to her.
    bob = _as(browser, team, team["bob"]["token"])
    bob.goto("/")
    bob.wait_for_selector(f'#experiments tbody tr[data-id="{team["bob_run"]}"]')
    assert bob.locator("#experiments tbody tr[data-id]").count() == 1
    assert not pg.errors and not bob.errors, (pg.errors, bob.errors)


@pytest.mark.own_auth
def test_sharing_through_the_page_lets_the_other_user_read_the_run(browser, team):
    c, run, bob = team["client"], team["ann_run"], team["bob"]
    assert c.get(f"/experiments/{run}", headers=bob["auth"]).status_code == 404
    pg = _as(browser, team, team["ann"]["token"])
    pg.goto(f"/ui/experiments/{run}")
    pg.wait_for_selector("#share .share-form")
    # The subtitle is filled from the experiment's own read, which may land after the form.
    pg.wait_for_function("document.querySelector('#subtitle').textContent.includes('owner ann')")
    pg.fill("#share .share-user", str(bob["id"]))
    pg.select_option("#share .share-access", "read")
    pg.click("#share .share-add")
    pg.wait_for_selector(f'#share li[data-user="{bob["id"]}"]')
    assert "read" in pg.inner_text(f'#share li[data-user="{bob["id"]}"]')
    shot(pg, "share-experiment")
    assert c.get(f"/experiments/{run}", headers=bob["auth"]).status_code == 200
    # Shared for reading: bob may not cancel it.
    assert c.post(f"/experiments/{run}/cancel", headers=bob["auth"]).status_code == 403
    # A user that does not exist: the API's 422 beside the form.
    pg.fill("#share .share-user", "9999")
    pg.click("#share .share-add")
    pg.wait_for_function("document.querySelector('#share .share-error').textContent.includes('does not exist')")
    # Taken back: a 404 for bob again.
    pg.click(f'#share li[data-user="{bob["id"]}"] [data-action=unshare]')
    pg.wait_for_selector(f'#share li[data-user="{bob["id"]}"]', state="detached")
    assert c.get(f"/experiments/{run}", headers=bob["auth"]).status_code == 404
    # Made public from the sweep's page: every user may read it.
    sweep = team["ann_sweep"]
    assert c.get(f"/sweeps/{sweep}", headers=bob["auth"]).status_code == 404
    pg.goto(f"/ui/sweeps/{sweep}")
    pg.wait_for_selector("#share .share-public[data-public=false]")
    pg.click("#share .share-public")
    pg.wait_for_selector("#share .share-public[data-public=true]")
    assert c.get(f"/sweeps/{sweep}", headers=bob["auth"]).status_code == 200
    # An upload, for writing, from the uploads page.
    upload = team["ann_upload"]
    pg.goto("/ui/datasets")
    pg.click(f'#datasets tr[data-id="{upload}"] [data-action=share]')
    pg.wait_for_selector("#share .share-form")
    pg.fill("#share .share-user", str(bob["id"]))
    pg.select_option("#share .share-access", "write")
    pg.click("#share .share-add")
    pg.wait_for_selector(f'#share li[data-user="{bob["id"]}"]')
    assert c.get(f"/datasets/{upload}", headers=bob["auth"]).status_code == 200
    shot(pg, "share-upload")
    assert not pg.errors, pg.errors


def test_the_audit_page_is_an_admin_s(browser, team):
    ann = _as(browser, team, team["ann"]["token"])
    ann.goto("/")
    ann.wait_for_selector("#whoami:not([hidden])")
    assert "ann · write" in ann.inner_text("#whoami")
    assert ann.locator("nav a[href='/ui/audit']").is_hidden()
    ann.goto("/ui/audit")  # by its address: the API refuses, the page says why
    ann.wait_for_selector("#flash:not([hidden])")
    assert "admin token" in ann.inner_text("#flash")
    assert not ann.locator("#audit tbody tr[data-id]").count()
    shot(ann, "audit-refused")

    root = _as(browser, team, team["root"]["token"])
    root.goto("/")
    root.wait_for_selector("nav a[href='/ui/audit']:not([hidden])")
    root.click("nav a[href='/ui/audit']")
    root.wait_for_selector("#audit tbody tr[data-id]")
    actions = root.locator("#audit tbody td code").all_inner_texts()
    assert "POST /experiments" in actions and "POST /users" in actions, actions
    root.select_option("#audit-filters select[name=user_id]", str(team["ann"]["id"]))
    root.click("#audit-filters button[type=submit]")
    root.wait_for_function("[...document.querySelectorAll('#audit tbody td.user')]"
                           ".every((td) => td.textContent === 'ann')")
    users = root.locator("#audit tbody td.user").all_inner_texts()
    assert users and set(users) == {"ann"}, users
    assert "user_id=" in root.url
    shot(root, "audit")
    assert not ann.errors and not root.errors, (ann.errors, root.errors)


@pytest.mark.own_auth
def test_every_page_shows_times_in_the_browser_s_zone(browser, team):
    """A browser in Tokyo: the audit log and the lists show each instant the API returns
    (with its offset) as that minute in Tokyo, the same way on every page (the audit page
    once showed an entry nine hours off the experiment list's, its time read without a
    zone as the browser's own)."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    def tokyo(iso: str) -> str:
        t = datetime.fromisoformat(iso).astimezone(ZoneInfo("Asia/Tokyo"))
        return f"{t:%b} {t.day}, {t.year}, {t:%I:%M %p}"  # en-US, as the page's formatter

    c, root = team["client"], team["root"]
    context = browser.new_context(viewport={"width": 1360, "height": 900}, base_url=team["url"],
                                  timezone_id="Asia/Tokyo", locale="en-US")
    team["contexts"].append(context)
    context.add_init_script(f"sessionStorage.setItem('corel-api-token', {root['token']!r})")
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    assert pg.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone") == "Asia/Tokyo"
    run = team["ann_run"]
    created = c.get(f"/experiments/{run}", headers=root["auth"]).json()["created_at"]
    pg.goto("/")
    cell = f'#experiments tr[data-id="{run}"] td.muted'
    pg.wait_for_selector(cell)
    assert tokyo(created) in pg.locator(f'#experiments tr[data-id="{run}"]').inner_text()
    pg.goto("/ui/sweeps")
    sweep = team["ann_sweep"]
    pg.wait_for_selector(f'#sweeps tr[data-id="{sweep}"]')
    sweep_created = c.get(f"/sweeps/{sweep}", headers=root["auth"]).json()["created_at"]
    assert tokyo(sweep_created) in pg.locator(f'#sweeps tr[data-id="{sweep}"]').inner_text()
    entry = c.get("/audit", params={"resource": "experiment", "resource_id": run},
                  headers=root["auth"]).json()["items"][-1]
    pg.goto("/ui/audit")
    pg.wait_for_selector(f'#audit tr[data-id="{entry["id"]}"]')
    shown = pg.locator(f'#audit tr[data-id="{entry["id"]}"] td').first.inner_text()
    assert shown == tokyo(entry["at"]), (shown, entry["at"])
    shot(pg, "audit-tokyo")
    assert not errors, errors


def test_the_models_page_lists_each_model_s_contract_and_versions(page, client, digits_runs):
    import uuid

    name = f"page-{uuid.uuid4().hex[:8]}"
    assert client.post("/models", json={"name": name, "description": "two heads"}).status_code == 201
    for run in (digits_runs["cosine"], digits_runs["gaussian"]):
        assert client.post(f"/models/{name}/versions", json={"experiment_id": run}).status_code == 201
    page.goto("/ui/models")
    row = f'#models tr[data-name="{name}"]'
    page.wait_for_selector(row)
    assert page.inner_text(f"{row} td.inputs") == "images 1×8×8"
    assert page.inner_text(f"{row} td.num") == "10"
    assert page.inner_text(f"{row} td.gate-rows") == "the test split"
    links = page.locator(f"{row} td.versions a")
    assert links.all_inner_texts() == ["v1", "v2"]
    assert [links.nth(i).get_attribute("href") for i in range(2)] == [
        f"/ui/experiments/{digits_runs['cosine']}", f"/ui/experiments/{digits_runs['gaussian']}"]
    # An alias: a first promotion, then a gated one (whatever its gate says, its report is shown).
    for version, expected in ((1, None), (2, 1)):
        r = client.post(f"/models/{name}/aliases/production",
                        json={"version": version, "expected_version": expected, "margin": 1.0})
        assert r.status_code == 202, r.text
        pid = r.json()["promotion_id"]
        wait_until(lambda pid=pid: client.get(f"/models/{name}/promotions/{pid}").json()[
            "status"] in ("succeeded", "refused"), 120, "the promotion")
    now = client.get(f"/models/{name}").json()["aliases"]["production"]
    page.reload()
    page.wait_for_selector(f'{row} td.aliases a[data-alias="production"]')
    assert page.inner_text(f"{row} td.aliases") == f"production → v{now}"
    page.click(f'{row} td.aliases a[data-alias="production"]')
    page.wait_for_selector("#promotions tbody tr:nth-child(2)")
    statuses = page.locator("#promotions td.status").all_inner_texts()
    gated = client.get(f"/models/{name}/promotions", params={"alias": "production"}).json()
    assert statuses == [p["status"] for p in gated] and statuses[1] == "succeeded"
    assert page.locator("#history tbody tr").count() == (2 if now == 2 else 1)
    page.wait_for_function("document.getElementById('recall-plot').data !== undefined")
    bars = page.evaluate("document.getElementById('recall-plot').data.map((t) => t.y)")
    recall = gated[0]["report"]["class_recall"]
    assert bars == [[c["incumbent"] for c in recall], [c["candidate"] for c in recall]]
    shot(page, "models")
    # An evaluation upload set (PATCH /models/{name}): the gate's rows are named.
    upload = client.post("/datasets", files={"file": ("eval.npz", npz_bytes(
        x=np.zeros((12, 8, 8), np.float32), y=np.arange(12) % 4))}).json()["id"]
    assert client.patch(f"/models/{name}", json={"eval_dataset_id": upload}).status_code == 200
    page.reload()
    page.wait_for_selector(f"{row} td.gate-rows a")
    assert page.inner_text(f"{row} td.gate-rows") == f"upload #{upload}"
    page.click(f'{row} button[data-action="share"]')
    page.wait_for_selector("#share .share-form")
    assert name in page.inner_text("#share-title")
    assert not page.errors, page.errors
