"""The paper's baselines as ordinary policies behind the allocation interface (importing this
package registers them): `k8s`, `static`, `serverless`, `api-retry`, `fixed-dop`,
`by-resource`. Their trajectory-level behaviour (pods, deployments, retries) is a `Lifecycle`
of `evaluation.closedloop`."""

from evaluation.baselines import api, composite, fixed, gpu, k8s  # noqa: F401
from evaluation.baselines.api import ApiRetry
from evaluation.baselines.common import Lifecycles, NoLifecycle
from evaluation.baselines.composite import ByResource
from evaluation.baselines.fixed import FixedDop
from evaluation.baselines.gpu import Serverless, StaticServices, pin_services, serverless_executors
from evaluation.baselines.k8s import Kubernetes

__all__ = [
    "ApiRetry",
    "ByResource",
    "FixedDop",
    "Kubernetes",
    "Lifecycles",
    "NoLifecycle",
    "Serverless",
    "StaticServices",
    "pin_services",
    "serverless_executors",
]
