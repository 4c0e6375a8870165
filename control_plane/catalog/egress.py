"""What moving data out of a provider costs: dollars per GB by source provider, and how fast it moves."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class EgressRates(BaseModel):
    """Dollars per GB to move data out of one provider's region, and how fast it moves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    same_region: Annotated[float, Field(ge=0)] = 0.0
    cross_region: Annotated[float, Field(ge=0)] = 0.02  # same provider, another region
    cross_provider: Annotated[float, Field(ge=0)] = 0.09  # out to the internet / another cloud
    gbps: Annotated[float, Field(gt=0)] = 10.0  # sustained transfer rate, gigabits per second


class EgressTable(BaseModel):
    """Egress prices by source provider (the one that bills for data leaving it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = ""
    as_of: dt.date | None = None
    default: EgressRates = Field(default_factory=EgressRates)
    providers: dict[str, EgressRates] = Field(default_factory=dict)

    def rates(self, provider: str) -> EgressRates:
        return self.providers.get(provider, self.default)

    def price_per_gb(self, src_provider: str, src_region: str, dst_provider: str, dst_region: str) -> float:
        rates = self.rates(src_provider)
        if src_provider != dst_provider:
            return rates.cross_provider
        return rates.same_region if src_region == dst_region else rates.cross_region
