"""API tokens: made, listed without their secret, revoked; stored hashed."""

from __future__ import annotations

import hashlib

from api.db import ApiToken
from tests.api.conftest import Api


def test_create_list_revoke(api: Api):
    resp = api.post("/system/tokens")
    assert resp.json["code"] == 0
    new = resp.json["data"]
    assert new["token"].startswith("ac-") and new["kind"] == "api"
    fresh = Api(api.app, new["token"])
    assert fresh.get("/agents").status_code == 200

    listed = api.get("/system/tokens").json["data"]
    assert {t["id"] for t in listed} >= {new["id"]}
    # The list never shows a usable token.
    assert all(t["token"] not in (api.token, new["token"]) for t in listed)

    assert api.delete(f"/system/tokens/{new['token']}").json["code"] == 0
    resp = fresh.get("/agents")
    assert resp.status_code == 401 and resp.json["code"] == 401
    resp = api.delete(f"/system/tokens/{new['token']}")
    assert resp.status_code == 404 and resp.json["code"] == 102

    by_id = api.post("/system/tokens").json["data"]
    assert api.delete(f"/system/tokens/{by_id['id']}").json["code"] == 0
    assert Api(api.app, by_id["token"]).get("/agents").status_code == 401


def test_tokens_are_stored_hashed(api: Api):
    token = api.post("/system/tokens").json["data"]["token"]
    with api.app.app_context():
        row = ApiToken.get(ApiToken.token_hash == hashlib.sha256(token.encode()).hexdigest())
        assert token not in {row.token_hash, row.hint, row.id}


def test_token_bad_input(api: Api):
    resp = api.post("/system/tokens", json={"kind": "root"})
    assert resp.status_code == 400 and "'root'" in resp.json["message"]
    resp = api.post("/system/tokens", json={"kind": 3})
    assert resp.status_code == 400 and "'kind'" in resp.json["message"]
    embed = api.post("/system/tokens", json={"kind": "embed"}).json["data"]
    assert embed["kind"] == "embed" and embed["token"].startswith("acembed-")
    # An embed token does not open the management API.
    assert Api(api.app, embed["token"]).get("/agents").status_code == 401
