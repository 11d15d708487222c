from tests.engines import require_backend

ENGINE = require_backend()
