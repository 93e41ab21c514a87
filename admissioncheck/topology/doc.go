// Package topology turns the node labels named in GangFitParameters'
// topologyLevels into the two descriptions of the same hierarchy that the
// schedulers around gpupack read: a Kueue Topology (the levels, broad to
// narrow) and a tree of Volcano HyperNodes (one per domain, tier 1 the
// narrowest level above the nodes).
//
// The pure part — Discover, HyperNodes, KueueTopology, Diff, TierOf — has no
// client; the reconciler in controller.go lists nodes, calls them, and writes
// only what differs.
package topology
