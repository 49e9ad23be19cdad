"""The page's scripts as ES modules, served as static files: `GET /lab/js/<path>` is the file ui/<path>
when it ends in .js (nothing else of ui/ is served). Each module imports the others by relative path
(`../shell/http.js`), so the folder tree is the URL tree; the page's <head> loads one of them, the
entry module (ui/entry.js: ENTRY).

`no-cache`: the browser revalidates each module on every page load (a 304 from its ETag on loopback),
so an edited script takes effect on a reload. `route_modules` serves the same files to a Playwright
page without a server: tests and ui/bench.py run the pure modules in Chromium so."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

UI = Path(__file__).resolve().parents[1]
PREFIX = "/lab/js/"
ENTRY = PREFIX + "entry.js"
MEDIA = "text/javascript; charset=utf-8"


def script(rel: str) -> Path | None:
    """The module at `rel` (a path under ui/), or None: not a .js file of ui/."""
    path = (UI / rel).resolve()
    if path.suffix != ".js" or not path.is_file() or not path.is_relative_to(UI):
        return None
    return path


def static_router() -> APIRouter:
    router = APIRouter()

    @router.get(PREFIX + "{rel:path}", include_in_schema=False)
    async def module(rel: str):
        path = script(rel)
        if path is None:
            raise HTTPException(404, {"message": f"no page script {rel!r}"})
        return FileResponse(path, media_type=MEDIA, headers={"Cache-Control": "no-cache"})

    return router


def route_modules(page, origin: str = "http://lab.test") -> str:
    """Serve ui/'s modules to a Playwright `page` at `origin` + PREFIX and open a blank page there (a
    module's imports need an origin); `await import(origin + PREFIX + 'chat/overlays.js')` then loads one."""
    def fulfil(route):
        rel = route.request.url.split(PREFIX, 1)[1].split("?", 1)[0]
        path = script(rel)
        if path is None:
            route.fulfill(status=404, body="not a page script")
        else:
            route.fulfill(status=200, content_type=MEDIA, body=path.read_text())

    page.route(f"{origin}{PREFIX}**", fulfil)
    page.route(f"{origin}/", lambda route: route.fulfill(status=200, content_type="text/html",
                                                         body="<!doctype html><html><body></body></html>"))
    page.goto(f"{origin}/")
    return origin
