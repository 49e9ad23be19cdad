"""The page's scripts as ES modules, served as static files: `GET /lab/js/<version>/<path>` is the file
ui/<path> when it ends in .js (nothing else of ui/ is served). Each module imports the others by
relative path (`../shell/http.js`), so the folder tree is the URL tree; the page's <head> preloads
them all (`modulepreload`: one parallel round of fetches, not one round per level of imports) and runs
one, the entry module (ui/entry.js).

`Scripts` reads the files once, when the app is built, and names them by a hash of their bytes (the
version in the URL): what a URL serves never changes, so the browser keeps each module (`immutable`)
and a reload fetches none of them; an edited script is served, under a new version, once the server
restarts. `route_modules` serves the files as they are on disk to a Playwright page without a server:
tests and ui/bench.py run the pure modules in Chromium so."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

UI = Path(__file__).resolve().parents[1]
PREFIX = "/lab/js/"
MEDIA = "text/javascript; charset=utf-8"
CACHED = {"Cache-Control": "public, max-age=31536000, immutable"}


def script(rel: str) -> Path | None:
    """The module at `rel` (a path under ui/), or None: not a .js file of ui/."""
    path = (UI / rel).resolve()
    if path.suffix != ".js" or not path.is_file() or not path.is_relative_to(UI):
        return None
    return path


class Scripts:
    def __init__(self):
        self.files = {p.relative_to(UI).as_posix(): p.read_bytes() for p in sorted(UI.rglob("*.js"))}
        digest = hashlib.sha256()
        for rel, body in self.files.items():
            digest.update(rel.encode() + b"\0" + body + b"\0")
        self.root = f"{PREFIX}{digest.hexdigest()[:12]}/"
        self.entry = self.root + "entry.js"

    def urls(self) -> list[str]:
        """Every module's URL, the entry first (the <head>'s preloads)."""
        return [self.entry] + [self.root + rel for rel in self.files if rel != "entry.js"]

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.get(PREFIX + "{version}/{rel:path}", include_in_schema=False)
        async def module(version: str, rel: str):
            body = self.files.get(rel)
            if body is None or self.root != f"{PREFIX}{version}/":
                raise HTTPException(404, {"message": f"no page script {rel!r} in this version of the page: reload it"})
            return Response(body, media_type=MEDIA, headers=CACHED)

        return router


def route_modules(page, origin: str = "http://lab.test") -> str:
    """Serve ui/'s modules, as they are on disk, to a Playwright `page` at `origin` + PREFIX and open a blank
    page there (a module's imports need an origin); `await import(origin + PREFIX + 'chat/overlays.js')`
    then loads one."""
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
