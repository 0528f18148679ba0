// A fixture for the layering check (never compiled): the rest of the scheduler may not
// reach the job module at all.
#include "vflow/job/control_plane.h"
