// A small program on a client generated from Spar's OpenAPI document: the types come from
// openapi-typescript (spar-api.d.ts, which tests/integration/test_openapi_clients.py
// generates beside a copy of this file), the calls from openapi-fetch.  It is only
// compiled (tsc --noEmit): what must compile is what a TypeScript user of Spar writes.
import createClient from "openapi-fetch";
import type { components, paths } from "./spar-api";

type Schemas = components["schemas"];

const spar = createClient<paths>({ baseUrl: "http://127.0.0.1:8000" });

// A trigger's webhook, as a sender signs it: the three Standard Webhooks headers and a body.
export async function deliver(triggerId: string, body: Record<string, unknown>): Promise<string> {
  const { data, error } = await spar.POST("/v1/hooks/triggers/{trigger_id}", {
    params: {
      path: { trigger_id: triggerId },
      header: {
        "webhook-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
        "webhook-timestamp": 1700000000,
        "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
      },
    },
    body,
  });
  if (data === undefined) {
    throw new Error(JSON.stringify(error.detail));
  }
  return data.execution_id;
}

// A manual fire and a secret rotation take an optional body: none is sent here.
export async function fireAndRotate(orgId: string, triggerId: string): Promise<string> {
  const path = { org_id: orgId, trigger_id: triggerId };
  const fired = await spar.POST("/v1/orgs/{org_id}/triggers/{trigger_id}/fire", {
    params: { path },
  });
  const rotated = await spar.POST("/v1/orgs/{org_id}/triggers/{trigger_id}/rotate-secret", {
    params: { path },
  });
  if (fired.data === undefined || rotated.data === undefined) {
    throw new Error("refused");
  }
  const status: "queued" | "running" | "succeeded" | "failed" | "missed" = fired.data.status;
  return `${status} ${rotated.data.webhook_secret}`;
}

// Statuses and verdicts are the API's enums, not any string.
export function outcome(run: Schemas["ScenarioRunRead"], batch: Schemas["BatchRunRead"]): string {
  const finished: Schemas["ScenarioRunRead"]["status"][] = ["passed", "failed", "error"];
  // @ts-expect-error: a run has no such status
  const unknown: Schemas["ScenarioRunRead"]["status"] = "exploded";
  const verdicts = (run.turn_results ?? []).flatMap((turn) =>
    turn.criteria_results.map((result) => result.verdict),
  );
  const passed: ("PASS" | "FAIL")[] = verdicts;
  return `${finished.includes(run.status)} ${unknown} ${passed.length} ${batch.status}`;
}
