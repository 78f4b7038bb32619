"""Every ORM model, imported here so Alembic and the metadata see the whole schema."""

from shared.db.base import Base
from shared.db.models.batches import BatchRun
from shared.db.models.calibration import Calibration
from shared.db.models.identity import (
    Membership,
    Organization,
    PlatformToken,
    Role,
    User,
    UserToken,
)
from shared.db.models.knowledge import (
    KnowledgeBookmarkAgent,
    KnowledgeChunk,
    KnowledgeCollection,
    KnowledgeDocument,
)
from shared.db.models.notifications import NotificationEvent, WebhookDelivery, WebhookEndpoint
from shared.db.models.outbound import Agent, AllowedDomain, Credential, LLMProvider
from shared.db.models.scenarios import (
    Criterion,
    CriterionResult,
    Scenario,
    ScenarioRun,
    ScenarioTurn,
    TurnResult,
)
from shared.db.models.triggers import Trigger, TriggerExecution

__all__ = [
    "Agent",
    "AllowedDomain",
    "Base",
    "BatchRun",
    "Calibration",
    "Credential",
    "Criterion",
    "CriterionResult",
    "KnowledgeBookmarkAgent",
    "KnowledgeChunk",
    "KnowledgeCollection",
    "KnowledgeDocument",
    "LLMProvider",
    "Membership",
    "NotificationEvent",
    "Organization",
    "PlatformToken",
    "Role",
    "Scenario",
    "ScenarioRun",
    "ScenarioTurn",
    "Trigger",
    "TriggerExecution",
    "TurnResult",
    "User",
    "UserToken",
    "WebhookDelivery",
    "WebhookEndpoint",
]
