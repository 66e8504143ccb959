//! [`Network`]: the network namespaces the `partition` fault cuts.
//!
//! One run with `partition` gets a bridge `kw<tag>br` in the host namespace
//! holding the first address of a private /24 (the metadata store listens
//! there; the managers, `keyway ctl` and the workload stay in the host
//! namespace and reach the nodes over the bridge), and per node `i` a
//! network namespace `kw<tag>-n<i>` whose one veth (`kw<tag>p<i>`, address
//! `.10+i`) is paired with `kw<tag>h<i>` on the bridge. A partition takes
//! that host-side veth down: the node then reaches neither the metadata
//! store nor its peers (nor clients or managers) until it is set up again.
//!
//! Narrower cuts need no packet filter (this machine has neither iptables
//! nor nft, nor netem): the metadata store listens on a second address of
//! the bridge (`.2`, [`Network::store_ip`]; the host's own connections to
//! the nodes keep the primary `.1` as their source), so a blackhole route
//! in node `i`'s namespace to `.2` cuts it from the store only
//! ([`Network::cut_store`]), and blackhole routes to the other nodes'
//! addresses cut it from its peers only ([`Network::cut_peers`]): its
//! packets to them are dropped, so no TCP exchange either way completes,
//! while clients and managers (source `.1`) still reach it.
//!
//! `<tag>` is three hex digits `k` that also fix the subnet
//! `10.(200 + k / 256).(k % 256).0/24`; creating the bridge is the claim
//! (it fails if another run holds that tag), and a subnet any address on
//! this machine already lies in is skipped, so two runs never collide and
//! no address outside the namespaces made here is ever a target.
//! Everything created is removed on drop, in reverse order, also when the
//! setup failed half way; nothing not created here is ever touched.

use crate::NemesisError;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// How many tags (and so /24 subnets) runs pick from.
const MAX_TAGS: u32 = 4096;
/// Tags tried before giving up (each taken one costs one `ip link add`).
const MAX_TAG_ATTEMPTS: u32 = 64;
/// The nodes' addresses start at this host number of the /24.
const FIRST_NODE_HOST: u8 = 10;
/// The metadata store's own address on the bridge (secondary to `.1`).
const STORE_HOST: u8 = 2;

/// One object this module created, removed on drop.
#[derive(Debug)]
enum Made {
    Bridge(String),
    Netns(String),
    Veth(String),
}

/// The run's bridge, namespaces and veth pairs.
#[derive(Debug)]
pub struct Network {
    tag: String,
    subnet: [u8; 3],
    nodes: usize,
    made: Vec<Made>,
    /// Blackhole routes in effect, per node (removed by [`Network::heal_cuts`]).
    cuts: std::sync::Mutex<Vec<Vec<Ipv4Addr>>>,
}

/// Runs `ip ARGS`: Ok, or its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `ip` output, or why not.
fn ip_output(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn unavailable(why: String) -> NemesisError {
    NemesisError::Unavailable(format!(
        "the partition fault is unavailable: {why} (it needs iproute2's `ip` and root, to create network namespaces, veth pairs and a bridge); leave `partition` out of --faults"
    ))
}

impl Network {
    /// Creates the bridge and one namespace per node; see the module docs.
    /// [`NemesisError::Unavailable`] when this machine cannot.
    pub fn create(nodes: usize) -> Result<Network, NemesisError> {
        assert!(
            (1..=usize::from(u8::MAX - FIRST_NODE_HOST)).contains(&nodes),
            "{nodes} nodes do not fit the /24"
        );
        ip_output(&["-V"]).map_err(unavailable)?;
        let start = (std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos()))
            % MAX_TAGS;
        let mut last = String::from("no tag tried");
        for attempt in 0..MAX_TAG_ATTEMPTS {
            let k = (start + attempt * 37) % MAX_TAGS;
            let subnet = [10, 200 + (k / 256) as u8, (k % 256) as u8];
            let mut net = Network {
                tag: format!("{k:03x}"),
                subnet,
                nodes,
                made: Vec::new(),
                cuts: std::sync::Mutex::new(vec![Vec::new(); nodes]),
            };
            if net.subnet_in_use()? {
                last = format!("subnet {}.0/24 in use", net.prefix());
                continue;
            }
            let bridge = net.bridge();
            match ip(&["link", "add", &bridge, "type", "bridge"]) {
                Ok(()) => net.made.push(Made::Bridge(bridge)),
                Err(e) if e.contains("File exists") => {
                    last = e;
                    continue;
                }
                Err(e) => return Err(unavailable(e)),
            }
            net.build().map_err(unavailable)?;
            return Ok(net);
        }
        Err(unavailable(format!(
            "no free tag after {MAX_TAG_ATTEMPTS} attempts: {last}"
        )))
    }

    /// Whether an address on this machine (host namespace) lies in the subnet.
    fn subnet_in_use(&self) -> Result<bool, NemesisError> {
        let addrs = ip_output(&["-o", "-4", "addr", "show"]).map_err(unavailable)?;
        let routes = ip_output(&["-4", "route", "show"]).map_err(unavailable)?;
        let prefix = format!(" {}.", self.prefix());
        let in_use = |text: &str| text.lines().any(|l| format!(" {l}").contains(&prefix));
        Ok(in_use(&addrs) || in_use(&routes))
    }

    /// Everything after the bridge: its address, the namespaces, the veths.
    fn build(&mut self) -> Result<(), String> {
        let bridge = self.bridge();
        let host = format!("{}/24", self.host_ip());
        ip(&["addr", "add", &host, "dev", &bridge])?;
        let store = format!("{}/24", self.store_ip());
        ip(&["addr", "add", &store, "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..self.nodes {
            let ns = self.netns(i);
            ip(&["netns", "add", &ns])?;
            self.made.push(Made::Netns(ns.clone()));
            let (h, p) = (self.host_veth(i), self.peer_veth(i));
            ip(&["link", "add", &h, "type", "veth", "peer", "name", &p])?;
            self.made.push(Made::Veth(h.clone()));
            ip(&["link", "set", &p, "netns", &ns])?;
            ip(&["link", "set", &h, "master", &bridge])?;
            ip(&["link", "set", &h, "up"])?;
            let addr = format!("{}/24", self.node_ip(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &p])?;
            ip(&["-n", &ns, "link", "set", &p, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    fn prefix(&self) -> String {
        let [a, b, c] = self.subnet;
        format!("{a}.{b}.{c}")
    }

    fn bridge(&self) -> String {
        format!("kw{}br", self.tag)
    }

    fn host_veth(&self, i: usize) -> String {
        format!("kw{}h{i}", self.tag)
    }

    fn peer_veth(&self, i: usize) -> String {
        format!("kw{}p{i}", self.tag)
    }

    /// The namespace node `i` runs in.
    pub fn netns(&self, i: usize) -> String {
        format!("kw{}-n{i}", self.tag)
    }

    /// The bridge's address (the metadata store listens on it).
    pub fn host_ip(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 1)
    }

    /// The metadata store's address (a second address of the bridge, so a
    /// node can be cut from it alone).
    pub fn store_ip(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, STORE_HOST)
    }

    /// Node `i`'s address, in its namespace.
    pub fn node_ip(&self, i: usize) -> Ipv4Addr {
        assert!(i < self.nodes);
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, FIRST_NODE_HOST + i as u8)
    }

    /// Cuts node `i` off: its host-side veth goes down.
    pub fn partition(&self, i: usize) -> Result<(), NemesisError> {
        ip(&["link", "set", &self.host_veth(i), "down"]).map_err(NemesisError::Invalid)
    }

    /// Ends [`Network::partition`].
    pub fn heal(&self, i: usize) -> Result<(), NemesisError> {
        ip(&["link", "set", &self.host_veth(i), "up"]).map_err(NemesisError::Invalid)
    }

    /// Cuts node `i` from the metadata store only (a blackhole route in its
    /// namespace to [`Network::store_ip`]); peers, clients and managers
    /// still reach it.
    pub fn cut_store(&self, i: usize) -> Result<(), NemesisError> {
        self.blackhole(i, &[self.store_ip()])
    }

    /// Cuts node `i` from every other node only (blackhole routes in its
    /// namespace to their addresses); the store, clients and managers
    /// still reach it.
    pub fn cut_peers(&self, i: usize) -> Result<(), NemesisError> {
        let peers: Vec<Ipv4Addr> = (0..self.nodes)
            .filter(|j| *j != i)
            .map(|j| self.node_ip(j))
            .collect();
        self.blackhole(i, &peers)
    }

    fn blackhole(&self, i: usize, to: &[Ipv4Addr]) -> Result<(), NemesisError> {
        let ns = self.netns(i);
        let mut cuts = self.cuts.lock().unwrap_or_else(|e| e.into_inner());
        for addr in to {
            let dst = format!("{addr}/32");
            ip(&["-n", &ns, "route", "add", "blackhole", &dst]).map_err(NemesisError::Invalid)?;
            cuts[i].push(*addr);
        }
        Ok(())
    }

    /// Ends [`Network::cut_store`] and [`Network::cut_peers`] of node `i`.
    pub fn heal_cuts(&self, i: usize) -> Result<(), NemesisError> {
        let ns = self.netns(i);
        let mut cuts = self.cuts.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(addr) = cuts[i].pop() {
            let dst = format!("{addr}/32");
            if let Err(e) = ip(&["-n", &ns, "route", "del", "blackhole", &dst]) {
                cuts[i].push(addr);
                return Err(NemesisError::Invalid(e));
            }
        }
        Ok(())
    }

    /// Whether this machine can run the `partition` fault: creates one
    /// namespace under a fresh tag and removes it again.
    pub fn probe() -> Result<(), NemesisError> {
        Network::create(1).map(drop)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Reverse order: veths and namespaces before the bridge. A veth
        // whose peer's namespace is gone is gone with it (the error is moot).
        while let Some(m) = self.made.pop() {
            let _ = match &m {
                Made::Veth(v) => ip(&["link", "del", v]),
                Made::Netns(n) => ip(&["netns", "del", n]),
                Made::Bridge(b) => ip(&["link", "del", b]),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names must fit Linux's 15-byte interface names.
    #[test]
    fn names_fit_and_addresses_stay_in_the_subnet() {
        let net = Network {
            tag: format!("{:03x}", MAX_TAGS - 1),
            subnet: [10, 215, 255],
            nodes: 16,
            made: Vec::new(),
            cuts: std::sync::Mutex::new(vec![Vec::new(); 16]),
        };
        for n in [net.bridge(), net.host_veth(15), net.peer_veth(15)] {
            assert!(n.len() <= 15, "{n}");
        }
        assert_eq!(net.host_ip(), Ipv4Addr::new(10, 215, 255, 1));
        assert_eq!(net.node_ip(15), Ipv4Addr::new(10, 215, 255, 25));
        assert_eq!(net.store_ip(), Ipv4Addr::new(10, 215, 255, 2));
    }

    fn link_state(name: &str) -> Option<String> {
        let out = ip_output(&["-br", "link", "show", "dev", name]).ok()?;
        out.split_whitespace().nth(1).map(str::to_string)
    }

    /// Against the real kernel (root; `KEYWAY_NEMESIS_NO_PARTITION=1` leaves
    /// it out on a machine without namespaces): two runs' networks never
    /// share a tag or a subnet, a partition takes exactly that node's veth
    /// down and the heal brings it back, and drop removes everything made.
    #[test]
    fn networks_are_disjoint_cut_and_healed_and_removed_on_drop() {
        if std::env::var_os("KEYWAY_NEMESIS_NO_PARTITION").is_some() {
            return;
        }
        let a = Network::create(2).unwrap_or_else(|e| panic!("{e}"));
        let b = Network::create(1).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(a.tag, b.tag);
        assert_ne!(a.subnet, b.subnet);
        let namespaces = ip_output(&["netns", "list"]).unwrap();
        assert!(namespaces.contains(&a.netns(1)), "{namespaces}");
        assert_eq!(link_state(&a.bridge()).as_deref(), Some("UP"));
        a.partition(1).unwrap();
        assert_eq!(link_state(&a.host_veth(1)).as_deref(), Some("DOWN"));
        assert_ne!(link_state(&a.host_veth(0)).as_deref(), Some("DOWN"));
        a.heal(1).unwrap();
        assert_ne!(link_state(&a.host_veth(1)).as_deref(), Some("DOWN"));
        // The narrow cuts: blackhole routes in the node's namespace only.
        let routes = |i: usize| ip_output(&["-n", &a.netns(i), "route", "show"]).unwrap();
        a.cut_store(0).unwrap();
        a.cut_peers(0).unwrap();
        let r = routes(0);
        assert!(r.contains(&format!("blackhole {}", a.store_ip())), "{r}");
        assert!(r.contains(&format!("blackhole {}", a.node_ip(1))), "{r}");
        assert!(!routes(1).contains("blackhole"), "node1 untouched");
        a.heal_cuts(0).unwrap();
        assert!(!routes(0).contains("blackhole"), "{}", routes(0));
        // And they cut what they say, TCP both ways: a listener on the
        // store's address, one on the host's, one in node 1's namespace.
        let store = std::net::TcpListener::bind((a.store_ip(), 0)).unwrap();
        let host = std::net::TcpListener::bind((a.host_ip(), 0)).unwrap();
        let (store_at, host_at) = (store.local_addr().unwrap(), host.local_addr().unwrap());
        let mut peer = Command::new("ip")
            .args(["netns", "exec", &a.netns(1), "python3", "-c"])
            .arg("import socket,time; s=socket.socket(); s.bind(('0.0.0.0', 7999)); s.listen(); time.sleep(60)")
            .spawn()
            .unwrap();
        let peer_at = format!("{}:7999", a.node_ip(1));
        // Whether node 0's namespace can open a TCP connection to `to`.
        let reach = |to: &str| {
            let (h, p) = to.split_once(':').unwrap();
            Command::new("ip")
                .args(["netns", "exec", &a.netns(0), "timeout", "2", "bash", "-c"])
                .arg(format!("exec 3<>/dev/tcp/{h}/{p}"))
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success()
        };
        let (store_at, host_at) = (store_at.to_string(), host_at.to_string());
        assert!(
            keyway_testkit::wait_until(
                "node 1's listener",
                std::time::Duration::from_secs(10),
                || reach(&peer_at).then_some(())
            )
            .is_ok(),
            "node 0 never reached node 1"
        );
        assert!(reach(&store_at) && reach(&host_at));
        a.cut_store(0).unwrap();
        assert!(!reach(&store_at), "cut from the store");
        assert!(reach(&host_at) && reach(&peer_at), "only from the store");
        a.heal_cuts(0).unwrap();
        a.cut_peers(0).unwrap();
        assert!(!reach(&peer_at), "cut from its peers");
        assert!(reach(&host_at) && reach(&store_at), "only from its peers");
        a.heal_cuts(0).unwrap();
        assert!(reach(&peer_at) && reach(&store_at), "healed");
        let _ = peer.kill();
        let _ = peer.wait();
        let names = [a.bridge(), a.host_veth(0), a.host_veth(1), a.netns(0)];
        drop(a);
        let namespaces = ip_output(&["netns", "list"]).unwrap();
        for n in &names[..3] {
            assert_eq!(link_state(n), None, "{n} left behind");
        }
        assert!(!namespaces.contains(&names[3]), "{namespaces}");
        assert!(
            namespaces.contains(&b.netns(0)),
            "another run's network is untouched"
        );
    }
}
