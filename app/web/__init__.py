"""The dashboard: server-rendered page shells at ``/`` and ``/ui/...``.

Every page is a Jinja2 template with no data in it; its script reads the JSON API
(with the bearer token the user typed, when the service has one), so the pages follow
the same rules as any other client and answer at once however large the database.
plotly.js comes from the ``plotly`` package, and the API's documentation pages (``/docs``,
Swagger UI; ``/redoc``) take their scripts from the ``fastapi-offline`` package, so nothing is
fetched from a CDN.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from app.core.errors import NotFound
from corel.encoder_catalog import DECLARATIONS as ENCODERS
from corel.loss_catalog import DECLARATIONS, Option
from corel.spec import DATASETS

HERE = Path(__file__).parent
STATIC = HERE / "static"
STATIC_FILES = {p.name: p for p in STATIC.iterdir() if p.is_file()}
templates = Jinja2Templates(directory=HERE / "templates")

router = APIRouter(include_in_schema=False)

# Pages: (template, title) by path; the nav shows those with a label.
NAV = (("/", "Experiments"), ("/ui/new", "New experiment"), ("/ui/sweeps", "Sweeps"),
       ("/ui/datasets", "Uploads"), ("/ui/models", "Models"), ("/ui/compare", "Compare"), ("/ui/playground", "Playground"))
# Shown only when GET /me says the token is an admin's (app.js); the API refuses the rest.
ADMIN_NAV = (("/ui/audit", "Audit"),)
CACHE = {"cache-control": "public, max-age=3600"}


def _docs_files() -> dict[str, Path]:
    import fastapi_offline

    folder = Path(fastapi_offline.__file__).parent / "static"
    return {p.name: p for p in folder.iterdir() if p.is_file()}


DOCS_FILES = _docs_files()
DOCS_MEDIA = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


# (path, template, title): the title may name the page's path parameter.
PAGES = (
    ("/", "experiments.html", "Experiments"),
    ("/ui/new", "new.html", "New experiment"),
    ("/ui/experiments/{experiment_id:int}", "experiment.html", "Experiment {experiment_id}"),
    ("/ui/compare", "compare.html", "Compare"),
    ("/ui/sweeps", "sweeps.html", "Sweeps"),
    ("/ui/sweeps/{sweep_id:int}", "sweep.html", "Sweep {sweep_id}"),
    ("/ui/playground", "playground.html", "Playground"),
    ("/ui/datasets", "datasets.html", "Uploads"),
    ("/ui/models", "models.html", "Models"),
    ("/ui/audit", "audit.html", "Audit"),
)


def _option_help(option: Option) -> str:
    """A loss's option as the form explains it: what it does (its doc) and what it allows."""
    doc = f"{option.doc[:1].upper()}{option.doc[1:]}. " if option.doc else ""
    return f"{doc}Allowed: {option.allowed()}."


def losses_for_pages() -> dict[str, dict[str, object]]:
    """What the pages' scripts know of each loss (app.js reads it): its names, whether it has
    a lambda, and its own options with their defaults (read per page: registered losses too)."""
    return {d.name: {"short": d.short, "display": d.display, "lam": "lam" in d.params,
                     "params": list(d.params),
                     "options": {o.field: o.default for o in d.options},
                     "option_docs": {o.field: _option_help(o) for o in d.options},
                     "prediction": d.prediction}
            for d in DECLARATIONS.values()}


def encoders_for_pages() -> dict[str, str]:
    """Each pretrained encoder's display name by the name a spec gives it (app.js reads it:
    corel/encoder_catalog.py declares them)."""
    return {d.name: d.display for d in ENCODERS.values() if d.pretrained and not d.custom}


def _page_route(template: str, title: str) -> Callable[[Request], HTMLResponse]:
    def page(request: Request) -> HTMLResponse:
        params = dict(request.path_params)
        return templates.TemplateResponse(request, template, {
            "title": title.format(**params), "nav": NAV, "admin_nav": ADMIN_NAV, "path": request.url.path,
            "datasets": DATASETS, "losses": losses_for_pages(), "encoders": encoders_for_pages(), **params})

    return page


for _path, _template, _title in PAGES:
    router.add_api_route(_path, _page_route(_template, _title), methods=["GET"],
                         response_class=HTMLResponse)


@router.get("/ui/static/plotly.min.js")
def plotly_js() -> Response:
    return FileResponse(_plotly_js(), media_type="text/javascript", headers=CACHE)


@router.get("/ui/static/{name}")
def static(name: str) -> Response:
    # A flat folder, listed once: the name is looked up, never joined into a path.
    if name not in STATIC_FILES:
        raise NotFound(f"no dashboard file {name!r}")
    media = "text/javascript" if name.endswith(".js") else "text/css"
    return FileResponse(STATIC_FILES[name], media_type=media, headers={"cache-control": "no-cache"})


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json", title="corel: API (Swagger UI)",
        swagger_js_url="/ui/static/docs/swagger-ui-bundle.js",
        swagger_css_url="/ui/static/docs/swagger-ui.css",
        swagger_favicon_url="/ui/static/docs/favicon.png")


@router.get("/redoc")
def redoc() -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title="corel: API (ReDoc)",
                          redoc_js_url="/ui/static/docs/redoc.standalone.js",
                          redoc_favicon_url="/ui/static/docs/favicon.png", with_google_fonts=False)


@router.get("/ui/static/docs/{name}")
def docs_static(name: str) -> Response:
    if name not in DOCS_FILES:
        raise NotFound(f"no documentation file {name!r}")
    return FileResponse(DOCS_FILES[name], media_type=DOCS_MEDIA.get(Path(name).suffix, "text/plain"),
                        headers=CACHE)
