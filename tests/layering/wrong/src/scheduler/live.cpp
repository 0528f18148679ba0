// A fixture for the layering check (never compiled): the scheduler's live mode may use
// the job's control-plane client, but not the engine.
#include <vector>

#include "vflow/engine/trainer.h"
#include "vflow/job/control_plane.h"
