/**
 * The layers and rooms of the source tree, bottom first: the one place their order is written.
 * layering.test.ts holds every import to it; architecture-page.ts renders docs/architecture.md's
 * file tables in the same order.
 */
/** Bottom first. Folders are repository paths; a file belongs to the longest one that holds it. */
export const LAYERS: readonly (readonly string[])[] = [
  ['native', 'src/wire'],
  ['src/common'],
  // Kanal's own terms that server and agent share: metrics and their label values, refusals, dial results.
  ['src/domain'],
  // The vocabulary of settings (a setting's kinds, its table's derived views); each command's table sits beside what it configures.
  ['src/settings'],
  ['src/transport'],
  ['src/tunnel'],
  // The audit log: the records tunnelled connections and dials make, their writer and its settings.
  ['src/audit'],
  ['src/kube'],
  ['src/server', 'src/agent'],
  ['src/cli'],
  // The demo's and tests' kit, outside the shipped package: nothing in the product may import it.
  ['kit/pki'],
  // One way to launch Kanal (in process from flags, or as a CLI child), one log reader, one cleanup scope.
  ['kit/launch'],
  // The demo, and the release build (the single executable): nothing imports either.
  ['kit/demo', 'kit/release'],
];

/**
 * Rooms of a folder, bottom first, like LAYERS one level down: a file in a
 * room imports only from lower rooms or its own ('.' is the folder's own
 * files). Every subfolder must be placed.
 */
export const ROOMS: Readonly<Record<string, readonly (readonly string[])[]>> = {
  'src/server': [
    // Who a peer is (certificates, tokens, roles) and the server's leases: they need nothing else here.
    ['identity', 'leases'],
    // Which agent a dial goes to; where node -> control plane dials may go.
    ['routing', 'destinations'],
    // Agents joining, and the registry of those that did.
    ['agents'],
    // Who a frontend client is and what it may reach: its rules, limits, names resolved in the cluster, direct routes.
    ['clients'],
    // The control plane's side: the front doors (HTTP CONNECT and forward proxy, gRPC, SOCKS5, the Unix socket), dials through an agent.
    ['frontends'],
    // One cluster's room made of the above, whose a connection is, and the tenants file's reloads.
    ['tenants'],
    // A server's worker processes (docs/multi-tenant.md): the primary, the hand-off and relay of another worker's tenants.
    ['workers'],
    // KanalServer and its listeners.
    ['.'],
    // Settings and configuration, read by the CLI before the server is built.
    ['config'],
    // The one assembly: a command's configuration made complete options, for the CLI, the kit, the demo and the bench.
    ['assembly'],
  ],
};
