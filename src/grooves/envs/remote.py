"""A remote environment that looks local: the `Environment` contract over `grooves env serve`.

`RemoteEnvironment(url)` answers `scenarios`, `reset` and `validate` by HTTP, and `reset` returns
a `RemoteEpisode` whose methods map one-to-one onto the server's session endpoints, so
`run_episode` and `make_rollout` work unchanged against an environment running elsewhere.

A bad tool call is still an ordinary tool message (the server's episode turns it into one); only
transport failures and refusals (an expired session, a full server) raise `RemoteEnvError`,
which the rollout loop records as a failed trajectory.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from grooves.envs.base import Grade, Limits, Scenario, Split, ValidationReport, as_messages, parse_tool_call


class RemoteEnvError(RuntimeError):
    """The environment server refused a request or could not be reached."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"environment server answered {status}: {detail}")
        self.status = status
        self.detail = detail


def _check(response: httpx.Response) -> httpx.Response:
    if response.is_success:
        return response
    try:
        detail = response.json().get("detail", response.text)
    except (json.JSONDecodeError, AttributeError):
        detail = response.text
    raise RemoteEnvError(response.status_code, str(detail))


class RemoteEnvironment:
    """An `Environment` served by `grooves env serve` at `base_url`."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0, client: httpx.Client | None = None):
        self._http = client or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s)
        self._info: dict[str, Any] | None = None

    def _describe(self) -> dict[str, Any]:
        if self._info is None:
            self._info = _check(self._http.get("/env")).json()
        return self._info

    @property
    def name(self) -> str:
        return str(self._describe()["name"])

    @property
    def limits(self) -> Limits:
        return Limits.model_validate(self._describe()["limits"])

    def scenarios(self, split: Split) -> list[Scenario]:
        """The server's scenarios without their answers (`expected` stays on the server, which grades).
        A split the server does not have raises ValueError, as a local environment's does."""
        try:
            return _check(self._http.get("/scenarios", params={"split": split})).json()
        except RemoteEnvError as exc:
            if exc.status == 400:  # an unknown split (an older server has no test split)
                raise ValueError(f"split {split!r}: {exc.detail}") from None
            raise

    def reset(self, scenario: Scenario) -> RemoteEpisode:
        body = _check(self._http.post("/sessions", json={"scenario": scenario})).json()
        return RemoteEpisode(self._http, body["session_id"], body["messages"], body["tools"])

    def validate(self) -> ValidationReport:
        body = _check(self._http.post("/validate")).json()
        body.pop("ok", None)
        return ValidationReport.model_validate(body)

    def close(self) -> None:
        self._http.close()


class RemoteEpisode:
    """One server session; the same methods as a local episode."""

    def __init__(
        self, http: httpx.Client, session_id: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ):
        self._http = http
        self.session_id = session_id
        self._messages = messages
        self._tools = tools
        self._done = False

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self._messages)

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self._tools

    @property
    def done(self) -> bool:
        return self._done

    def _url(self, suffix: str = "") -> str:
        return f"/sessions/{self.session_id}{suffix}"

    def step(self, tool_call: Any) -> dict[str, Any]:
        call = parse_tool_call(tool_call)
        raw = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        body = _check(self._http.post(self._url("/step"), json={"tool_call": raw})).json()
        self._done = bool(body["done"])
        return body["message"]

    def grade(self, trajectory: Any) -> Grade:
        body = _check(self._http.post(self._url("/grade"), json={"messages": as_messages(trajectory)})).json()
        return Grade.model_validate(body)

    def snapshot(self) -> bytes:
        return _check(self._http.get(self._url("/snapshot"))).content

    def restore(self, data: bytes) -> None:
        _check(
            self._http.put(
                self._url("/snapshot"), content=data, headers={"content-type": "application/octet-stream"}
            )
        )
        self._done = bool(self._status()["done"])

    def fork(self) -> RemoteEpisode:
        body = _check(self._http.post(self._url("/fork"))).json()
        child = RemoteEpisode(self._http, body["session_id"], body["messages"], body["tools"])
        child._done = self._done
        return child

    def _status(self) -> dict[str, Any]:
        return _check(self._http.get(self._url())).json()

    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._status()["metrics"].items()}

    def close(self) -> None:
        try:
            _check(self._http.delete(self._url()))
        except RemoteEnvError as exc:
            if exc.status != 404:  # already closed or expired: nothing left to release
                raise
