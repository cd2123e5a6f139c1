package app

import (
	"context"

	"github.com/creditd/creditd/api"
	"github.com/creditd/creditd/engine"
)

// Runners are the background loops Start starts and Stop stops, in that
// order.
func (a *App) Runners() []engine.Runner { return append([]engine.Runner(nil), a.runners...) }

// runnerChecks are /readyz's entries for the background loops, one per
// runner under its Name. They are advisory: a failing loop shows in the
// body and in creditd_runner_healthy but leaves the node in the load
// balancer, since every node runs every loop and requests do not wait on
// them (docs/decisions.md "Background loops in /readyz"); only redis
// takes a node out (docs/decisions.md "Readiness is this node's").
func runnerChecks(runners []engine.Runner) []api.HealthCheck {
	checks := make([]api.HealthCheck, len(runners))
	for i, r := range runners {
		checks[i] = api.HealthCheck{Name: r.Name(), Advisory: true, Check: func(context.Context) error {
			if err := r.Health(); err != nil {
				// Health's text is public (engine.Unhealthy); its cause,
				// which may name hosts, was logged by the loop.
				return api.NotReady(err.Error())
			}
			return nil
		}}
	}
	return checks
}
