"""HTTP routes: thin; the service object lives on ``request.app.state.service``."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import JSONResponse

from mcprl_scenario_gen.api import (
    CreateScenarioSetRequest,
    Links,
    ScenarioList,
    ScenarioSetCreated,
    ScenarioSetList,
    ScenarioSetStatus,
)
from mcprl_scenario_gen.service import ScenarioGenService

router = APIRouter(prefix="/v1/scenario-sets", tags=["scenario-sets"])
# Shown in the OpenAPI document (and sent by schemathesis' explicit phase).
CREATE_EXAMPLES = {"sql": {
    "summary": "12 verifiable SQL questions, a quarter held out for val",
    "value": {"mcp_url": "http://127.0.0.1:8903/mcp", "strategy": "sql", "n": 12,
              "val_fraction": 0.25, "seed": 0},
}}


def _service(request: Request) -> ScenarioGenService:
    return request.app.state.service


def _links(set_id: str) -> Links:
    base = f"/v1/scenario-sets/{set_id}"
    return Links(self=base, scenarios_train=f"{base}/scenarios?split=train",
                 scenarios_val=f"{base}/scenarios?split=val")


@router.post("", status_code=202, response_model=ScenarioSetCreated)
async def create_scenario_set(
    body: Annotated[CreateScenarioSetRequest, Body(openapi_examples=CREATE_EXAMPLES)],
    request: Request,
) -> JSONResponse:
    job = await _service(request).create(body)
    created = ScenarioSetCreated(id=job.manifest.id, status="pending",
                                 links=_links(job.manifest.id))
    return JSONResponse(created.model_dump(), status_code=202,
                        headers={"Location": created.links.self})


@router.get("", response_model=ScenarioSetList)
async def list_scenario_sets(request: Request) -> ScenarioSetList:
    return ScenarioSetList(data=_service(request).list_sets())


@router.get("/{set_id}", response_model=ScenarioSetStatus)
async def get_scenario_set(set_id: str, request: Request) -> ScenarioSetStatus:
    manifest, progress = _service(request).status(set_id)
    return ScenarioSetStatus(id=set_id, status=manifest.status, progress=progress,
                             error=manifest.error, manifest=manifest)


@router.get("/{set_id}/scenarios", response_model=ScenarioList)
async def get_scenarios(
    set_id: str,
    request: Request,
    split: Literal["train", "val"] = Query("train", description="Which split."),
    format: Literal["full", "art"] = Query("full", description="'art': only task, difficulty."),
) -> ScenarioList:
    manifest, items = _service(request).scenarios(set_id, split)
    data = [s.to_art() for s in items] if format == "art" else items
    return ScenarioList(set_id=set_id, split=split, status=manifest.status, count=len(items),
                        data=data)


@router.post("/{set_id}/cancel", response_model=ScenarioSetStatus)
async def cancel_scenario_set(set_id: str, request: Request) -> ScenarioSetStatus:
    manifest = await _service(request).cancel(set_id)
    return ScenarioSetStatus(id=set_id, status=manifest.status, progress=manifest.progress,
                             error=manifest.error, manifest=manifest)


@router.delete("/{set_id}", status_code=204)
async def delete_scenario_set(set_id: str, request: Request) -> Response:
    await _service(request).delete(set_id)
    return Response(status_code=204)
