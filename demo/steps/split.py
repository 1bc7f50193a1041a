"""An 80/20 v1/v3 split over 1,000 requests (manifests/steps/2-split-80-20.yaml), jason still v2."""
from mcp26.demo.framework import Check, Demo, Step, show_counts
from mcp26.mesh.headers import END_USER


def run(demo: Demo) -> list[Check]:
    generation = demo.apply("virtualservice.yaml", demo.manifest("steps/2-split-80-20.yaml"))
    with demo.gateway() as gw:
        counts = gw.count(1000)
        jason = gw.count(20, {END_USER: "jason"})
    v1 = counts.get("v1", 0)
    print(f"  applied {generation} from the watched dir; 1000 requests -> {show_counts(counts)};"
          f" jason -> {show_counts(jason)}")
    # Binomial(1000, 0.8): 740..860 is beyond 4.7 standard deviations.
    return [Check("80/20 v1/v3 over 1000", "v1 740..860, rest v3", show_counts(counts),
                  740 <= v1 <= 860 and set(counts) == {"v1", "v3"}),
            Check("end-user: jason", "v2 20", show_counts(jason), jason == {"v2": 20})]


STEP = Step(50, "80/20 split", run)
