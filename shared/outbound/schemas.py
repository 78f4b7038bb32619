"""Request and response bodies of outbound configuration (DESIGN §5.1, spec 5-8)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec

from shared.llm.models import MAX_OPTIONS_BYTES, SPAR_FIELD_PATHS
from shared.schemas import HEADER_TEXT_PATTERN, SECRET, STORABLE, Input, Name255, Output, text

UNSET = msgspec.UNSET
UnsetType = msgspec.UnsetType

CREDENTIAL_KEY_PATTERN = "^[A-Za-z0-9_.-]{1,128}$"
CredentialKey = Annotated[str, msgspec.Meta(pattern=CREDENTIAL_KEY_PATTERN)]
Url = Annotated[str, text(1, 2048, description="An http(s) URL.")]
Model = Annotated[str, text(1, 255)]
# Free-form like JsonObject, so NUL and lone surrogates are refused at the offending key.
HeaderMap = Annotated[
    dict[
        Annotated[str, msgspec.Meta(min_length=1, max_length=255)],
        Annotated[str, msgspec.Meta(max_length=8192)],
    ],
    STORABLE,
]
ProviderKind = Literal["openai", "anthropic", "openai_compatible"]
AgentKind = Literal["http", "llm"]
AgentProtocol = Literal["spar", "openai_chat"]
Cost = Annotated[float, msgspec.Meta(ge=0)]
# Free-form like JsonObject (NUL, lone surrogates and deep nesting refused at the key);
# its size and the fields it may not set are the service's rules.
RequestOptions = Annotated[
    dict[str, Any],
    msgspec.Meta(
        description="Fields merged into each request body sent to the provider (a null "
        f"removes a field Spar would send). At most {MAX_OPTIONS_BYTES} bytes as JSON; the "
        f"fields Spar sets itself ({', '.join(SPAR_FIELD_PATHS)}) are refused."
    ),
    STORABLE,
]
AnthropicVersion = Annotated[
    str,
    msgspec.Meta(
        pattern="^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
        description="anthropic only: the anthropic-version header (default 2023-06-01).",
    ),
]


# --- allowed domains ---------------------------------------------------------------------------


class AllowedDomainCreate(Input):
    domain: Annotated[str, text(1, 255, description="host, IP or *.suffix")]
    headers: HeaderMap = {}
    query_params: HeaderMap = {}


class AllowedDomainUpdate(Input):
    domain: Annotated[str, text(1, 255)] | UnsetType = UNSET
    headers: HeaderMap | UnsetType = UNSET
    query_params: HeaderMap | UnsetType = UNSET


class AllowedDomainRead(Output):
    id: UUID
    organization_id: UUID
    domain: str
    headers: dict[str, str]
    query_params: dict[str, str]
    created_at: datetime
    updated_at: datetime


class AllowedDomainList(Output):
    domains: list[AllowedDomainRead]
    total: int


# --- credentials ----------------------------------------------------------------------------


# Sent in header and query values as it is, so one line: no CR, LF (or NUL).
CredentialValue = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=65_536,
        pattern=HEADER_TEXT_PATTERN,
        description="Write-only: never shown, not even in an error. No CR, LF or NUL.",
    ),
    SECRET,
]


class CredentialPut(Input):
    value: CredentialValue
    description: Annotated[str, text(0, 1000)] = ""


class CredentialRead(Output):
    """A credential as the API shows it: never its value."""

    key: str
    description: str
    created_at: datetime
    updated_at: datetime


class CredentialList(Output):
    credentials: list[CredentialRead]
    total: int


class ProviderReference(Output):
    id: UUID
    provider: ProviderKind
    name: str


class DomainReference(Output):
    id: UUID
    domain: str


class CredentialUsage(Output):
    llm_providers: list[ProviderReference]
    domains: list[DomainReference]


# --- LLM providers -------------------------------------------------------------------------------


class LLMProviderCreate(Input):
    name: Name255
    provider: ProviderKind
    default_model: Model
    base_url: Url | None = None
    credential_key: CredentialKey | None = None
    input_cost_per_mtok: Cost | None = None
    output_cost_per_mtok: Cost | None = None
    is_default_judge: bool = False
    request_options: RequestOptions = {}
    anthropic_version: AnthropicVersion | None = None


class LLMProviderUpdate(Input):
    name: Name255 | UnsetType = UNSET
    provider: ProviderKind | UnsetType = UNSET
    default_model: Model | UnsetType = UNSET
    base_url: Url | UnsetType | None = UNSET
    credential_key: CredentialKey | UnsetType | None = UNSET
    input_cost_per_mtok: Cost | UnsetType | None = UNSET
    output_cost_per_mtok: Cost | UnsetType | None = UNSET
    is_default_judge: bool | UnsetType = UNSET
    request_options: RequestOptions | UnsetType = UNSET
    anthropic_version: AnthropicVersion | UnsetType | None = UNSET


class LLMProviderRead(Output):
    id: UUID
    organization_id: UUID
    name: str
    provider: ProviderKind
    base_url: str
    default_model: str
    credential_key: str | None
    input_cost_per_mtok: float | None
    output_cost_per_mtok: float | None
    is_default_judge: bool
    request_options: dict[str, Any]
    anthropic_version: str | None
    created_at: datetime
    updated_at: datetime


class LLMProviderList(Output):
    llm_providers: list[LLMProviderRead]
    total: int


# --- agents -----------------------------------------------------------------------------------


class AgentCreate(Input):
    name: Name255
    kind: AgentKind
    description: Annotated[str, text(0, 10_000)] = ""
    endpoint_url: Url | None = None
    protocol: AgentProtocol | None = None
    llm_provider_id: UUID | None = None
    model: Model | None = None
    system_prompt: Annotated[str, text(0, 100_000)] | None = None
    judge_provider_id: UUID | None = None
    judge_model: Model | None = None


class AgentUpdate(Input):
    name: Name255 | UnsetType = UNSET
    kind: AgentKind | UnsetType = UNSET
    description: Annotated[str, text(0, 10_000)] | UnsetType = UNSET
    endpoint_url: Url | UnsetType | None = UNSET
    protocol: AgentProtocol | UnsetType | None = UNSET
    llm_provider_id: UUID | UnsetType | None = UNSET
    model: Model | UnsetType | None = UNSET
    system_prompt: Annotated[str, text(0, 100000)] | UnsetType | None = UNSET
    judge_provider_id: UUID | UnsetType | None = UNSET
    judge_model: Model | UnsetType | None = UNSET


class AgentRead(Output):
    id: UUID
    organization_id: UUID
    name: str
    description: str
    kind: AgentKind
    endpoint_url: str | None
    protocol: AgentProtocol | None
    llm_provider_id: UUID | None
    model: str | None
    system_prompt: str | None
    judge_provider_id: UUID | None
    judge_model: str | None
    created_at: datetime
    updated_at: datetime


class AgentList(Output):
    agents: list[AgentRead]
    total: int


# --- tool calls ---------------------------------------------------------------------------------

# The name of the one call that stands for the calls left out of a turn's stored calls (its
# arguments say how many, and the limit): no tool of an OpenAI or Anthropic agent can have it
# (their names are letters, digits, _ and -).
CUT = "spar:cut"


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool the agent called to produce a reply (protocol ``spar``'s ``tool_calls``, an
    ``openai_chat`` reply's ``tool_calls``, an ``llm`` agent's ``search_knowledge``).
    ``output`` is null when the agent did not report one."""

    name: Annotated[str, msgspec.Meta(min_length=1)]
    arguments: dict[str, Any] = {}
    output: Any = None

    def compact(self) -> str:
        """One line: ``name({"arguments":...}) -> output`` (:func:`compact_json`, the output
        left out when none was reported); the cut marker as what it says."""
        if self.name == CUT:
            cut, limit = self.arguments.get("calls_cut"), self.arguments.get("max_bytes")
            return f"[{cut} more tool calls not kept: over {limit} bytes]"
        shown = f"{self.name}({compact_json(self.arguments)})"
        return shown if self.output is None else f"{shown} -> {compact_json(self.output)}"


def compact_json(value: Any) -> str:
    """``value`` as JSON on one line, object keys sorted: the same text whether it comes
    straight from the agent or back from the database (JSONB keeps no key order)."""
    return msgspec.json.encode(value, order="sorted").decode()
