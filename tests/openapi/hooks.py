"""Schemathesis hooks for tests/openapi/run (loaded through SCHEMATHESIS_HOOKS).

The run authenticates with the operator token of the server's first start. Schemathesis feeds
names it saw (GET /api/v1/tokens lists that one too) to DELETE /api/v1/tokens/{name}; were the
run's own token revoked, every later request would be a (documented) 401 and test nothing.
So that one request goes to another name instead.
"""

import os

import schemathesis

OWN = os.environ.get("OPENAPI_TOKEN_NAME", "operator")


@schemathesis.hook
def before_call(context, case, kwargs):
    if (
        case.operation.method.upper() == "DELETE"
        and case.operation.path == "/api/v1/tokens/{name}"
        and (case.path_parameters or {}).get("name") == OWN
    ):
        case.path_parameters = {**case.path_parameters, "name": OWN + "-spared"}
