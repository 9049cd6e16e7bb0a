"""A built-in table of real cloud regions and the network latencies between them.

The paper samples cells hierarchically from real Google cell locations and uses historical
inter-cell round-trip times. We have no access to those measurements, so we use:

- **Locations**: the cities Google Cloud publishes for its regions (cloud.google.com/about/locations;
  e.g. us-central1 = Council Bluffs, Iowa; europe-west1 = St. Ghislain, Belgium), with city-level
  coordinates. Regions are grouped by continent for the hierarchical sampling, and every region has
  up to three zones (cells).
- **Round-trip times**: great-circle distance × a route-inflation factor of 1.5, at the speed of light
  in optical fibre (≈ 2.0e5 km/s, refractive index ≈ 1.47), plus 1 ms of switching/queueing. Fibre
  paths are longer than great circles; Singla et al., *The Internet at the Speed of Light* (HotNets
  2014), discuss this inflation. The factor is our assumption; it gives e.g. Iowa↔Belgium ≈ 106 ms
  and Iowa↔Tokyo ≈ 150 ms RTT, in the range of public inter-region latency dashboards. Two zones of
  the same region are 1 ms RTT apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FIBRE_KM_PER_S = 2.0e5
ROUTE_FACTOR = 1.5
BASE_RTT_S = 0.001
ZONES_PER_REGION = 3
#: Root → leaf inside one cell (same building).
LOCAL_ONE_WAY_S = 0.0002


@dataclass(frozen=True)
class Region:
    name: str
    city: str
    continent: str
    lat: float
    lon: float


REGIONS: tuple[Region, ...] = (
    Region("us-central1", "Council Bluffs, Iowa", "north-america", 41.26, -95.86),
    Region("us-east1", "Moncks Corner, South Carolina", "north-america", 33.20, -80.01),
    Region("us-east4", "Ashburn, Virginia", "north-america", 39.04, -77.49),
    Region("us-west1", "The Dalles, Oregon", "north-america", 45.60, -121.18),
    Region("us-west2", "Los Angeles, California", "north-america", 34.05, -118.24),
    Region("northamerica-northeast1", "Montréal, Québec", "north-america", 45.50, -73.57),
    Region("southamerica-east1", "Osasco, São Paulo", "south-america", -23.53, -46.79),
    Region("southamerica-west1", "Santiago, Chile", "south-america", -33.45, -70.67),
    Region("europe-west1", "St. Ghislain, Belgium", "europe", 50.45, 3.82),
    Region("europe-west2", "London, England", "europe", 51.51, -0.13),
    Region("europe-west3", "Frankfurt, Germany", "europe", 50.11, 8.68),
    Region("europe-west4", "Eemshaven, Netherlands", "europe", 53.44, 6.83),
    Region("europe-north1", "Hamina, Finland", "europe", 60.57, 27.20),
    Region("europe-southwest1", "Madrid, Spain", "europe", 40.42, -3.70),
    Region("asia-east1", "Changhua County, Taiwan", "asia-pacific", 24.05, 120.52),
    Region("asia-northeast1", "Tokyo, Japan", "asia-pacific", 35.68, 139.69),
    Region("asia-southeast1", "Jurong West, Singapore", "asia-pacific", 1.34, 103.71),
    Region("asia-south1", "Mumbai, India", "asia-pacific", 19.08, 72.88),
    Region("australia-southeast1", "Sydney, Australia", "asia-pacific", -33.87, 151.21),
)


def great_circle_km(a: Region, b: Region) -> float:
    """Haversine distance on a 6371 km sphere."""
    p1, p2 = math.radians(a.lat), math.radians(b.lat)
    dp, dl = p2 - p1, math.radians(b.lon - a.lon)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * 6371.0 * math.asin(min(1.0, math.sqrt(h)))


def rtt_s(a: Region, b: Region) -> float:
    """Estimated round-trip time between two regions (seconds); see the module docstring."""
    return BASE_RTT_S + 2.0 * ROUTE_FACTOR * great_circle_km(a, b) / FIBRE_KM_PER_S


def sample_cells(rng: np.random.Generator, n_cells: int) -> tuple[list[str], np.ndarray]:
    """Hierarchical sample of ``n_cells`` cells: continents → regions → zones.

    Returns cell names (``region-zone``) and the one-way latency matrix τ (seconds, RTT/2).
    """
    if not 1 <= n_cells <= len(REGIONS) * ZONES_PER_REGION:
        raise ValueError(f"n_cells must be in [1, {len(REGIONS) * ZONES_PER_REGION}]: {n_cells}")
    continents = sorted({r.continent for r in REGIONS})
    n_cont = int(rng.integers(1, min(3, len(continents)) + 1))
    chosen = list(rng.choice(continents, size=n_cont, replace=False))
    pool = [r for r in REGIONS if r.continent in chosen]
    # Enough regions to hold the cells (3 zones each), at most one per cell, at least one.
    need = math.ceil(n_cells / ZONES_PER_REGION)
    while len(pool) < need:  # widen to more continents when the chosen ones are too small
        extra = [c for c in continents if c not in chosen]
        chosen.append(extra[int(rng.integers(len(extra)))])
        pool = [r for r in REGIONS if r.continent in chosen]
    n_reg = int(rng.integers(need, min(n_cells, len(pool)) + 1))
    regions = [pool[k] for k in rng.choice(len(pool), size=n_reg, replace=False)]
    # Every region gets one zone, the rest are spread at random (≤ 3 zones per region).
    zones = [1] * n_reg
    while sum(zones) < n_cells:
        k = int(rng.integers(n_reg))
        if zones[k] < ZONES_PER_REGION:
            zones[k] += 1
    cells: list[tuple[Region, str]] = []
    for region, z in zip(regions, zones, strict=True):
        for zi in range(z):
            cells.append((region, f"{region.name}-{'abc'[zi]}"))
    n = len(cells)
    tau = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i == j:
                tau[i, j] = LOCAL_ONE_WAY_S
            else:
                tau[i, j] = (BASE_RTT_S if cells[i][0] is cells[j][0] else rtt_s(cells[i][0], cells[j][0])) / 2.0
    return [name for _r, name in cells], tau
