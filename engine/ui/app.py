"""The UI's aiohttp application: routes, the read model it answers from, error pages.

One ReadModel per application, opened on the first request (so the server starts even while
the broker is away) and closed on shutdown; every request catches it up first, which reads
only what was appended since the previous request (engine/readmodel/model.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from aiokafka.errors import KafkaConnectionError

from runstream.engine.config import journal_topic
from runstream.engine.errors import (
    InvalidInput,
    QueryInvalid,
    RunExpired,
    RunNotFound,
    RunstreamError,
)
from runstream.engine.journal.timetext import iso_time
from runstream.engine.readmodel.describe import run_view
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.schedule_view import schedule_view
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.cut import SystemState, parse_instant, state_of_model
from runstream.engine.ui import pages, run_page
from runstream.engine.ui.dryrun_page import DryRunner, dry_run_fragment
from runstream.engine.ui.html import error_page, esc, input_time
from runstream.engine.ui.queries import (
    RunDetail,
    StateAt,
    list_runs,
    page_size,
    parse_filter,
    run_detail,
    state_at_record,
    status_counts,
)
from runstream.engine.ui.schedules_page import schedules_page
from runstream.projections.expiry import schedule_now
from runstream.projections.state import RunStatus, round_zero

STATIC_DIR = Path(__file__).parent / "static"
COUNT_LIMIT = 100_000  # runs counted per status on the system page ("now")
CHANGED_LIMIT = 50  # runs whose status changed since an instant, listed on the system page


@dataclass(frozen=True, slots=True)
class UiSettings:
    bootstrap: str
    namespace: str
    read_model_dir: Path | None = None  # None: the default directory for the namespace
    app: str | None = None  # flows (`package.module:attr`) a run page can dry-run against

    @property
    def context(self) -> str:
        return f"namespace {self.namespace} · {self.bootstrap}"


SETTINGS = web.AppKey("settings", UiSettings)
MODEL = web.AppKey("model", ReadModel)
DRY_RUN = web.AppKey("dry_run", DryRunner)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(settings: UiSettings) -> web.Application:
    """The UI as an aiohttp application (serve it with web.AppRunner or engine.ui.serve_ui).
    Raises AppNotFound for an `app` that names no flows."""
    app = web.Application(middlewares=[_errors])
    app[SETTINGS] = settings
    app[MODEL] = ReadModel(bootstrap=settings.bootstrap,
                           topic=journal_topic(settings.namespace), path=settings.read_model_dir)
    app[DRY_RUN] = DryRunner(settings.app)
    app.on_cleanup.append(_close_model)
    app.router.add_get("/", runs_handler)
    app.router.add_get("/api/runs", runs_api)
    app.router.add_get("/run", run_handler)
    app.router.add_get("/run/at", state_fragment_handler)
    app.router.add_get("/api/run/at", state_api)
    app.router.add_get("/run/dry-run", dry_run_handler)
    app.router.add_get("/schedules", schedules_handler)
    app.router.add_get("/api/schedules", schedules_api)
    app.router.add_get("/system", system_handler)
    app.router.add_get("/api/system", system_api)
    app.router.add_static("/static", STATIC_DIR)
    return app


async def _close_model(app: web.Application) -> None:
    await app[MODEL].close()


async def _view(request: web.Request) -> View:
    return await request.app[MODEL].catch_up()


async def _run_view(request: web.Request) -> View:
    """A view with the bytes of the run's records (its timeline and replays decode them;
    a partition loaded from a snapshot has none below its offset)."""
    model = request.app[MODEL]
    return await model.complete(await model.catch_up(), [_run_id(request)])


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


async def runs_handler(request: web.Request) -> web.Response:
    chosen = parse_filter(dict(request.query))
    context = request.app[SETTINGS].context
    try:
        page = list_runs(await _view(request), chosen)
    except QueryInvalid as exc:  # the form again, with what is wrong where
        return _html(pages.runs_page(None, chosen, context=context, error=exc), 400)
    return _html(pages.runs_page(page, chosen, context=context))


async def runs_api(request: web.Request) -> web.Response:
    page = list_runs(await _view(request), parse_filter(dict(request.query)))
    namespace = request.app[SETTINGS].namespace
    body: dict[str, Any] = {"runs": [run_view(run, namespace=namespace) for run in page.runs],
                            "next_after": page.next_after, "scanned": page.scanned}
    if page.matched is not None:
        body["count"] = page.matched
    return web.json_response(body)


def _run_id(request: web.Request) -> str:
    run_id = request.query.get("id", "")
    if not run_id:
        raise InvalidInput("which run? add ?id=<run id>")
    return round_zero(run_id)  # (`<lineage>~0`: round 0, as the CLI takes it)


def _record(request: web.Request, default: int | None = None) -> int:
    text = request.query.get("record", "")
    if not text and default is not None:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"record must be a whole number, not {text!r}") from None


# A long run's replays (its page, each move of its slider) run in a thread, with no fold of
# the read model meanwhile (ReadModel.in_thread): on the event loop they held every other
# request of the UI until they were done.

async def run_handler(request: web.Request) -> web.Response:
    run_id, model = _run_id(request), request.app[MODEL]
    view, settings = await _run_view(request), request.app[SETTINGS]

    def page_data() -> tuple[RunDetail, StateAt]:  # (one hold of the read model, not two)
        detail = run_detail(view, run_id, namespace=settings.namespace)
        return detail, state_at_record(view, run_id, _record(request, default=len(detail.rows)))

    detail, state = await model.in_thread(page_data)
    return _html(run_page.run_page(detail, state, context=settings.context,
                                   dry_run_app=settings.app, namespace=settings.namespace))


async def state_fragment_handler(request: web.Request) -> web.Response:
    return _html(run_page.state_fragment(await _state_at(request)))


async def state_api(request: web.Request) -> web.Response:
    return web.json_response((await _state_at(request)).as_dict())


async def _state_at(request: web.Request) -> StateAt:
    run_id, record, view = _run_id(request), _record(request), await _run_view(request)
    return await request.app[MODEL].in_thread(lambda: state_at_record(view, run_id, record))


async def dry_run_handler(request: web.Request) -> web.Response:
    if request.app[SETTINGS].app is None:
        raise InvalidInput("dry runs need the UI started with --app package.module:flows")
    report = await request.app[DRY_RUN].report(await _view(request), _run_id(request))
    return _html(dry_run_fragment(report))


# Schedules on one page of the schedules page (and of /api/schedules), unless ?limit= says.
SCHEDULES_PAGE = 100


async def _schedule_views(request: web.Request) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the schedules, by id (`?after=<id>&limit=N`), and the id the next page
    starts after (None: the last page). Every schedule was one row of one page."""
    after = request.query.get("after", "")
    limit = page_size(request.query.get("limit") or None, SCHEDULES_PAGE)
    model = request.app[MODEL]
    view = await model.catch_up()
    ids = sorted(sid for p in range(model.partitions) for sid in view.schedule_ids(p)
                 if sid > after)
    page: list[dict[str, Any]] = []
    for sid in ids:
        schedule = view.schedule(sid)
        if schedule is None or not schedule.exists:
            continue
        if len(page) == limit:
            return page, page[-1]["schedule_id"]
        page.append(schedule_view(schedule_now(view, schedule)))
    return page, None


async def schedules_handler(request: web.Request) -> web.Response:
    page, next_after = await _schedule_views(request)
    return _html(schedules_page(page, next_after, limit=request.query.get("limit"),
                                context=request.app[SETTINGS].context))


async def schedules_api(request: web.Request) -> web.Response:
    page, next_after = await _schedule_views(request)
    return web.json_response({"schedules": page, "next_after": next_after})


async def _system_report(request: web.Request) -> tuple[str, SystemState | None]:
    at_text = request.query.get("at", "").strip()
    if not at_text:
        return "", None
    at_ms = parse_instant(at_text)
    # (the form's field shows it as a datetime-local value: "...Z" or an offset it drops)
    return (input_time(at_ms),
            await state_of_model(request.app[MODEL], at_ms, limit=CHANGED_LIMIT))


async def system_handler(request: web.Request) -> web.Response:
    at_text, report = await _system_report(request)
    now = status_counts(await _view(request), limit=COUNT_LIMIT) if report is None else {
        status.value: report.comparison.counts_now[status] for status in RunStatus}
    return _html(pages.system_page(now=now, count_limit=COUNT_LIMIT,
                                   at_text=at_text or _now_text(), report=report,
                                   context=request.app[SETTINGS].context))


async def system_api(request: web.Request) -> web.Response:
    _, report = await _system_report(request)
    if report is not None:
        return web.json_response(report.as_dict())
    return web.json_response({"counts_now": status_counts(await _view(request),
                                                          limit=COUNT_LIMIT)})


def _now_text() -> str:
    return iso_time(int(time.time() * 1000), precision="s", zone="")


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors as one clear line: an HTML page, or JSON under /api/."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except RunExpired as exc:  # gone, and its page says when and where its records are
        return _error(request, 410, str(exc))
    except RunNotFound as exc:
        return _error(request, 404, str(exc) or "no such run")
    except InvalidInput as exc:
        return _error(request, 400, str(exc))
    except QueryInvalid as exc:
        return _error(request, 400, str(exc), position=exc.position)
    except KafkaConnectionError as exc:
        return _error(request, 503, f"cannot reach the Kafka broker at "
                                    f"{request.app[SETTINGS].bootstrap} ({exc})")
    except RunstreamError as exc:
        return _error(request, 500, str(exc))


def _error(request: web.Request, status: int, message: str, **extra: Any) -> web.Response:
    if request.path.startswith("/api/"):
        return web.json_response({"error": message, **extra}, status=status)
    if request.path in ("/run/at", "/run/dry-run"):  # fragments the page's script inserts
        return _html(f'<p class="error message">{esc(message)}</p>', status)
    return _html(error_page(status, message, context=request.app[SETTINGS].context), status)
