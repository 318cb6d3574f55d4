"""Offline API docs (apidocs/): the name server's and the broker container's /docs and /redoc
load only files their own server serves (the broker's is shown rendering in a real browser by
tests/browser). In-process apps, real HTTP through Starlette's test client."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from apidocs import ASSETS_URL, DOC_PATHS, install_offline_docs
from broker.container import BrokerContainer, ContainerConfig
from broker.http.acl import OPEN_PATHS
from namesrv.app import create_app
from namesrv.config import NamesrvConfig

# src="..." and href="..." of a page, and url(...) in its inline styles.
_REFERENCE = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\(\s*["']?([^"')]+)""")


def _apps() -> dict[str, FastAPI]:
    return {
        "namesrv": create_app(NamesrvConfig()),
        "container": BrokerContainer(ContainerConfig(broker_config_paths=["unused.conf"])).app(),
    }


@pytest.mark.parametrize("name", ["namesrv", "container"])
def test_docs_pages_reference_only_their_own_server(name: str) -> None:
    with TestClient(_apps()[name]) as client:
        for path in ("/docs", "/redoc"):
            page = client.get(path)
            assert page.status_code == 200, path
            assert "default-src 'self'" in page.headers["content-security-policy"]
            refs = [a or b for a, b in _REFERENCE.findall(page.text)]
            assert refs, f"{path} loads nothing?"
            assert all(r.startswith("/") for r in refs), (path, refs)
            assert "cdn" not in page.text.lower()
            for ref in refs:
                if ref.startswith(ASSETS_URL):
                    asset = client.get(ref)
                    assert asset.status_code == 200 and len(asset.content) > 1000, ref
        assert client.get("/openapi.json").json()["paths"]


def test_redoc_bundle_is_served_without_its_cdn_logo() -> None:
    with TestClient(_apps()["namesrv"]) as client:
        js = client.get(f"{ASSETS_URL}/redoc.standalone.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert b"cdn.redoc.ly" not in js.content
    assert b"https://cdn" not in js.content


def test_docs_stay_open_when_the_broker_has_access_control() -> None:
    assert DOC_PATHS <= OPEN_PATHS


def test_an_app_with_fastapis_cdn_docs_is_refused() -> None:
    with pytest.raises(ValueError, match="docs_url=None"):
        install_offline_docs(FastAPI())
