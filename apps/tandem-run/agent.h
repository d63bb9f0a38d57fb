// A multi-node job's agent (--nnodes N > 1 or MIN:MAX): meets the other agents in a rendezvous
// (rendezvous.h), runs this node's workers for the round, and restarts together with the others.
// Restarts are agreed across nodes: an agent whose worker fails records the failure for the round,
// ends its workers and joins the next round; the others see the record (within 200 ms), end
// theirs, and join too. The round number is the restart count, shared by all nodes and bounded by
// --max-restarts; when they are used up, every agent exits with the failed rank's exit code and one
// line naming its node and rank.
#pragma once

#include "worker_group.h"

namespace tandem::run {

// Runs the job on this node to the end; returns tandem-run's exit code.
int run_agent(GroupSpec spec);

}  // namespace tandem::run
