// A fixture for the layering check (never compiled): the communication layer must not
// reach the job layer, directly or by climbing directories.
#include "../job/roles.h"
#include "vflow/comm/communicator.h"
#include "vflow/job/launcher.h"
