"""Outbound configuration endpoints: allowed domains, credentials, LLM providers, agents."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, Response, delete, get, patch, post, put
from litestar.openapi import ResponseSpec
from litestar.params import JSONBody, PathParameter
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED

from api.deps import Access, Config, DbReads, DbSession, Page, PathId, listing, reading
from shared.identity.access import requires
from shared.outbound import schemas, services

CredentialKeyPath = Annotated[
    str,
    PathParameter(
        pattern=schemas.CREDENTIAL_KEY_PATTERN,
        description="Credential key: letters, digits, _ . - (1-128).",
    ),
]


class AllowedDomainController(Controller):
    path = "/orgs/{org_id:str}/allowed-domains"
    tags = ["allowed domains"]

    @get("/", operation_id="listAllowedDomains", access=requires("domains:read"))
    async def list_domains(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.AllowedDomainList:
        """The organization's allowed domains, paged."""
        return listing(
            schemas.AllowedDomainList,
            await reading(db_reads, services.list_domains, access=access, paging=paging),
        )

    @post("/", operation_id="createAllowedDomain", access=requires("domains:write"))
    async def create_domain(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.AllowedDomainCreate],
    ) -> schemas.AllowedDomainRead:
        """Allow a host, an IP or `*.suffix`; its headers and query params join every call."""
        return schemas.AllowedDomainRead.from_row(
            await services.create_domain(db_session, access=access, body=data)
        )

    @get("/{domain_id:str}", operation_id="getAllowedDomain", access=requires("domains:read"))
    async def get_domain(
        self, db_reads: DbReads, access: Access, org_id: PathId, domain_id: PathId
    ) -> schemas.AllowedDomainRead:
        """One allowed domain."""
        return schemas.AllowedDomainRead.from_row(
            await reading(db_reads, services.read_domain, access=access, domain_id=domain_id)
        )

    @patch("/{domain_id:str}", operation_id="updateAllowedDomain", access=requires("domains:write"))
    async def update_domain(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        domain_id: PathId,
        data: JSONBody[schemas.AllowedDomainUpdate],
    ) -> schemas.AllowedDomainRead:
        """Change an allowed domain, its headers or query params; omitted fields stay."""
        return schemas.AllowedDomainRead.from_row(
            await services.update_domain(db_session, access=access, domain_id=domain_id, body=data)
        )

    @delete(
        "/{domain_id:str}", operation_id="deleteAllowedDomain", access=requires("domains:write")
    )
    async def delete_domain(
        self, db_session: DbSession, access: Access, org_id: PathId, domain_id: PathId
    ) -> None:
        """Remove a host from the allowed domains."""
        await services.delete_domain(db_session, access=access, domain_id=domain_id)


class CredentialController(Controller):
    path = "/orgs/{org_id:str}/credentials"
    tags = ["credentials"]

    @get("/", operation_id="listCredentials", access=requires("credentials:read"))
    async def list_credentials(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.CredentialList:
        """Keys and descriptions; values are write-only and never returned."""
        return listing(
            schemas.CredentialList,
            await reading(db_reads, services.list_credentials, access=access, paging=paging),
        )

    @put(
        "/{key:str}",
        operation_id="putCredential",
        access=requires("credentials:write"),
        responses={
            HTTP_201_CREATED: ResponseSpec(
                schemas.CredentialRead, description="Created: the key was new."
            )
        },
    )
    async def put_credential(
        self,
        db_session: DbSession,
        settings: Config,
        access: Access,
        org_id: PathId,
        key: CredentialKeyPath,
        data: JSONBody[schemas.CredentialPut],
    ) -> Response[schemas.CredentialRead]:
        """Create (201) or replace (200) a credential; the value is encrypted at rest."""
        credential, created = await services.put_credential(
            db_session, settings=settings, access=access, key=key, body=data
        )
        return Response(
            schemas.CredentialRead.from_row(credential),
            status_code=HTTP_201_CREATED if created else HTTP_200_OK,
        )

    @delete("/{key:str}", operation_id="deleteCredential", access=requires("credentials:write"))
    async def delete_credential(
        self, db_session: DbSession, access: Access, org_id: PathId, key: CredentialKeyPath
    ) -> None:
        """Delete a credential nothing references (409 names the references)."""
        await services.delete_credential(db_session, access=access, key=key)

    @get("/{key:str}/usage", operation_id="getCredentialUsage", access=requires("credentials:read"))
    async def credential_usage(
        self, db_reads: DbReads, access: Access, org_id: PathId, key: CredentialKeyPath
    ) -> schemas.CredentialUsage:
        """The LLM providers and allowed domains that reference the credential."""
        return await reading(db_reads, services.credential_usage, access=access, key=key)


class LLMProviderController(Controller):
    path = "/orgs/{org_id:str}/llm-providers"
    tags = ["llm providers"]

    @get("/", operation_id="listLLMProviders", access=requires("providers:read"))
    async def list_providers(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.LLMProviderList:
        """The organization's LLM providers, paged."""
        return listing(
            schemas.LLMProviderList,
            await reading(db_reads, services.list_providers, access=access, paging=paging),
        )

    @post("/", operation_id="createLLMProvider", access=requires("providers:write"))
    async def create_provider(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.LLMProviderCreate],
    ) -> schemas.LLMProviderRead:
        """Register an LLM provider (its API key by credential key)."""
        return schemas.LLMProviderRead.from_row(
            await services.create_provider(db_session, access=access, body=data)
        )

    @get("/{provider_id:str}", operation_id="getLLMProvider", access=requires("providers:read"))
    async def get_provider(
        self, db_reads: DbReads, access: Access, org_id: PathId, provider_id: PathId
    ) -> schemas.LLMProviderRead:
        """One LLM provider."""
        return schemas.LLMProviderRead.from_row(
            await reading(db_reads, services.read_provider, access=access, provider_id=provider_id)
        )

    @patch(
        "/{provider_id:str}", operation_id="updateLLMProvider", access=requires("providers:write")
    )
    async def update_provider(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        provider_id: PathId,
        data: JSONBody[schemas.LLMProviderUpdate],
    ) -> schemas.LLMProviderRead:
        """Change an LLM provider; omitted fields stay."""
        return schemas.LLMProviderRead.from_row(
            await services.update_provider(
                db_session, access=access, provider_id=provider_id, body=data
            )
        )

    @delete(
        "/{provider_id:str}", operation_id="deleteLLMProvider", access=requires("providers:write")
    )
    async def delete_provider(
        self, db_session: DbSession, access: Access, org_id: PathId, provider_id: PathId
    ) -> None:
        """Delete a provider no agent uses (409 names the agents)."""
        await services.delete_provider(db_session, access=access, provider_id=provider_id)


class AgentController(Controller):
    path = "/orgs/{org_id:str}/agents"
    tags = ["agents"]

    @get("/", operation_id="listAgents", access=requires("agents:read"))
    async def list_agents(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.AgentList:
        """The organization's agents, paged."""
        return listing(
            schemas.AgentList,
            await reading(db_reads, services.list_agents, access=access, paging=paging),
        )

    @post("/", operation_id="createAgent", access=requires("agents:write"))
    async def create_agent(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.AgentCreate],
    ) -> schemas.AgentRead:
        """An `http` agent (endpoint_url + protocol) or an `llm` agent (provider + model)."""
        return schemas.AgentRead.from_row(
            await services.create_agent(db_session, access=access, body=data)
        )

    @get("/{agent_id:str}", operation_id="getAgent", access=requires("agents:read"))
    async def get_agent(
        self, db_reads: DbReads, access: Access, org_id: PathId, agent_id: PathId
    ) -> schemas.AgentRead:
        """One agent."""
        return schemas.AgentRead.from_row(
            await reading(db_reads, services.read_agent, access=access, agent_id=agent_id)
        )

    @patch("/{agent_id:str}", operation_id="updateAgent", access=requires("agents:write"))
    async def update_agent(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        agent_id: PathId,
        data: JSONBody[schemas.AgentUpdate],
    ) -> schemas.AgentRead:
        """Change an agent; omitted fields stay."""
        return schemas.AgentRead.from_row(
            await services.update_agent(db_session, access=access, agent_id=agent_id, body=data)
        )

    @delete("/{agent_id:str}", operation_id="deleteAgent", access=requires("agents:write"))
    async def delete_agent(
        self, db_session: DbSession, access: Access, org_id: PathId, agent_id: PathId
    ) -> None:
        """Delete an agent."""
        await services.delete_agent(db_session, access=access, agent_id=agent_id)


CONTROLLERS = [
    AllowedDomainController,
    CredentialController,
    LLMProviderController,
    AgentController,
]
