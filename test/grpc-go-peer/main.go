// grpc-go-peer plays the Go side of Konnectivity against Kanal, with grpc-go
// doing all of gRPC and HTTP/2 (the library upstream's agent, server and the
// KAS's konnectivity client are built on). No generated code: Packets are
// encoded with protowire, field numbers from upstream's client.proto.
//
//	agent   like upstream's agent: dials Kanal's agent port (mTLS), serves DIAL_REQ
//	client  like the KAS's gRPC mode: one ProxyService/Proxy stream per dial over Kanal's Unix socket
//	server  like upstream's server (its agent-port gRPC options): dials through a Kanal agent
//
// Each mode prints one JSON line per result on stdout; errors go to stderr
// with a non-zero exit.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/ioutil"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
)

// Packet types and payload field numbers of upstream's client.proto.
const (
	dialReq  = 0
	dialRsp  = 1
	closeReq = 2
	closeRsp = 3
	data     = 4
	dialCls  = 5
)

var payloadField = map[int]protowire.Number{dialReq: 2, dialRsp: 3, data: 4, closeReq: 5, closeRsp: 6, dialCls: 7}

// packet is the union of the fields the modes use.
type packet struct {
	kind      int
	protocol  string
	address   string
	random    int64
	connectID int64
	err       string
	data      []byte
}

func (p packet) encode() []byte {
	var sub []byte
	str := func(n protowire.Number, s string) {
		if s != "" {
			sub = protowire.AppendTag(sub, n, protowire.BytesType)
			sub = protowire.AppendString(sub, s)
		}
	}
	num := func(n protowire.Number, v int64) {
		if v != 0 {
			sub = protowire.AppendTag(sub, n, protowire.VarintType)
			sub = protowire.AppendVarint(sub, uint64(v))
		}
	}
	switch p.kind {
	case dialReq:
		str(1, p.protocol)
		str(2, p.address)
		num(3, p.random)
	case dialRsp:
		str(1, p.err)
		num(2, p.connectID)
		num(3, p.random)
	case closeReq:
		num(1, p.connectID)
	case closeRsp:
		str(1, p.err)
		num(2, p.connectID)
	case data:
		num(1, p.connectID)
		str(2, p.err)
		if len(p.data) > 0 {
			sub = protowire.AppendTag(sub, 3, protowire.BytesType)
			sub = protowire.AppendBytes(sub, p.data)
		}
	case dialCls:
		num(1, p.random)
	}
	var out []byte
	if p.kind != 0 {
		out = protowire.AppendTag(out, 1, protowire.VarintType)
		out = protowire.AppendVarint(out, uint64(p.kind))
	}
	out = protowire.AppendTag(out, payloadField[p.kind], protowire.BytesType)
	return protowire.AppendBytes(out, sub)
}

func decode(b []byte) (packet, error) {
	var p packet
	var sub []byte
	for len(b) > 0 {
		n, t, l := protowire.ConsumeTag(b)
		if l < 0 {
			return p, protowire.ParseError(l)
		}
		b = b[l:]
		switch {
		case n == 1 && t == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			if l < 0 {
				return p, protowire.ParseError(l)
			}
			p.kind, b = int(v), b[l:]
		case t == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return p, protowire.ParseError(l)
			}
			sub, b = v, b[l:]
		default:
			l := protowire.ConsumeFieldValue(n, t, b)
			if l < 0 {
				return p, protowire.ParseError(l)
			}
			b = b[l:]
		}
	}
	for len(sub) > 0 {
		n, t, l := protowire.ConsumeTag(sub)
		if l < 0 {
			return p, protowire.ParseError(l)
		}
		sub = sub[l:]
		if t == protowire.VarintType {
			v, l := protowire.ConsumeVarint(sub)
			if l < 0 {
				return p, protowire.ParseError(l)
			}
			sub = sub[l:]
			switch {
			case n == 3 && (p.kind == dialReq || p.kind == dialRsp), n == 1 && p.kind == dialCls:
				p.random = int64(v)
			default:
				p.connectID = int64(v)
			}
			continue
		}
		v, l := protowire.ConsumeBytes(sub)
		if l < 0 {
			return p, protowire.ParseError(l)
		}
		sub = sub[l:]
		switch {
		case p.kind == dialReq && n == 1:
			p.protocol = string(v)
		case p.kind == dialReq && n == 2:
			p.address = string(v)
		case p.kind == data && n == 3:
			p.data = append([]byte(nil), v...)
		default:
			p.err = string(v)
		}
	}
	return p, nil
}

// rawCodec hands encoded Packets to grpc-go as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v interface{}) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string   { return "proto" }
func (rawCodec) String() string { return "proto" }

// stream is what both client and server streams offer; sends are serialised.
type stream struct {
	s  grpc.Stream
	mu sync.Mutex
}

func (s *stream) send(p packet) error {
	b := p.encode()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.SendMsg(&b)
}

func (s *stream) recv() (packet, error) {
	var b []byte
	if err := s.s.RecvMsg(&b); err != nil {
		return packet{}, err
	}
	return decode(b)
}

func emit(v interface{}) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func fail(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "grpc-go-peer: "+format+"\n", a...)
	os.Exit(1)
}

func tlsConfig(ca, cert, key string, server bool) *tls.Config {
	pool := x509.NewCertPool()
	pem, err := ioutil.ReadFile(ca)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		fail("CA %s: %v", ca, err)
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		fail("key pair: %v", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if server {
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, pool
	} else {
		cfg.RootCAs = pool
	}
	return cfg
}

var bidi = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// ---------- agent ----------

// runAgent serves DIAL_REQ like upstream's agent: dial, DIAL_RSP, relay, CLOSE_RSP.
func runAgent(addr, id string, cfg *tls.Config) {
	conn, err := grpc.Dial(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		fail("dial %s: %v", addr, err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "agentid", id)
	cs, err := conn.NewStream(ctx, bidi, "/AgentService/Connect")
	if err != nil {
		fail("Connect: %v", err)
	}
	md, err := cs.Header()
	if err != nil {
		fail("Connect headers: %v", err)
	}
	emit(map[string]interface{}{"event": "connected", "serverID": md.Get("serverid")})
	s := &stream{s: cs}
	var mu sync.Mutex
	conns := map[int64]net.Conn{}
	var next int64
	for {
		p, err := s.recv()
		if err != nil {
			emit(map[string]interface{}{"event": "stream ended", "error": err.Error()})
			return
		}
		switch p.kind {
		case dialReq:
			c, err := net.DialTimeout(p.protocol, p.address, 5*time.Second)
			if err != nil {
				_ = s.send(packet{kind: dialRsp, random: p.random, err: err.Error()})
				continue
			}
			mu.Lock()
			next++
			id := next
			conns[id] = c
			mu.Unlock()
			_ = s.send(packet{kind: dialRsp, random: p.random, connectID: id})
			go func() {
				buf := make([]byte, 32*1024)
				for {
					n, err := c.Read(buf)
					if n > 0 && s.send(packet{kind: data, connectID: id, data: append([]byte(nil), buf[:n]...)}) != nil {
						return
					}
					if err != nil {
						mu.Lock()
						_, open := conns[id]
						delete(conns, id)
						mu.Unlock()
						if open {
							_ = s.send(packet{kind: closeRsp, connectID: id})
						}
						return
					}
				}
			}()
		case data:
			mu.Lock()
			c := conns[p.connectID]
			mu.Unlock()
			if c != nil {
				_, _ = c.Write(p.data)
			}
		case closeReq:
			mu.Lock()
			c := conns[p.connectID]
			delete(conns, p.connectID)
			mu.Unlock()
			if c != nil {
				c.Close()
			}
			_ = s.send(packet{kind: closeRsp, connectID: p.connectID})
		}
	}
}

// ---------- one tunnelled connection, from the dialling side ----------

// exchange dials `target` over s, sends `size` bytes to an echo server and
// checks they come back, then closes. Returns the dial latency and transfer time.
func exchange(s *stream, target string, random int64, size int) (dial, transfer time.Duration, err error) {
	start := time.Now()
	if err = s.send(packet{kind: dialReq, protocol: "tcp", address: target, random: random}); err != nil {
		return
	}
	rsp, err := s.recv()
	if err != nil {
		return
	}
	if rsp.kind != dialRsp || rsp.random != random {
		return 0, 0, fmt.Errorf("expected DIAL_RSP for %d, got type %d random %d", random, rsp.kind, rsp.random)
	}
	if rsp.err != "" {
		return 0, 0, fmt.Errorf("dial refused: %s", rsp.err)
	}
	dial = time.Since(start)
	id := rsp.connectID
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*7 + i/251)
	}
	start = time.Now()
	sendErr := make(chan error, 1)
	go func() {
		for off := 0; off < size; off += 32 * 1024 {
			end := off + 32*1024
			if end > size {
				end = size
			}
			if err := s.send(packet{kind: data, connectID: id, data: want[off:end]}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	got := make([]byte, 0, size)
	for len(got) < size {
		p, err := s.recv()
		if err != nil {
			return dial, 0, fmt.Errorf("after %d of %d bytes: %v", len(got), size, err)
		}
		if p.kind != data || p.connectID != id {
			return dial, 0, fmt.Errorf("after %d of %d bytes: unexpected packet type %d for connection %d", len(got), size, p.kind, p.connectID)
		}
		got = append(got, p.data...)
	}
	if err = <-sendErr; err != nil {
		return
	}
	transfer = time.Since(start)
	if !bytes.Equal(got, want) {
		return dial, transfer, errors.New("echoed bytes differ from those sent")
	}
	if err = s.send(packet{kind: closeReq, connectID: id}); err != nil {
		return
	}
	for {
		p, err := s.recv()
		if err != nil {
			return dial, transfer, fmt.Errorf("waiting for CLOSE_RSP: %v", err)
		}
		if p.kind == closeRsp && p.connectID == id {
			return dial, transfer, nil
		}
	}
}

func percentile(d []time.Duration, q float64) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000
}

// ---------- client ----------

// runClient opens one Proxy stream per dial. With singleUse it does what the
// KAS's konnectivity-client does (CreateSingleUseGrpcTunnel): a new gRPC
// connection per dial, closed after CLOSE_RSP, which cancels the stream.
// Otherwise the dials share one connection and each stream ends cleanly:
// CloseSend, and the server must answer with status OK, as upstream's does.
func runClient(uds, target string, size, dials int, singleUse bool) {
	connect := func() *grpc.ClientConn {
		conn, err := grpc.Dial("passthrough:///kanal", grpc.WithInsecure(),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", uds)
			}),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			fail("dial %s: %v", uds, err)
		}
		return conn
	}
	shared := connect()
	defer shared.Close()
	var lat []time.Duration
	for i := 0; i < dials; i++ {
		start := time.Now()
		conn := shared
		if singleUse {
			conn = connect()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cs, err := conn.NewStream(ctx, bidi, "/ProxyService/Proxy")
		if err != nil {
			fail("Proxy: %v", err)
		}
		n := 0
		if i == 0 {
			n = size
		}
		setup := time.Since(start)
		dial, transfer, err := exchange(&stream{s: cs}, target, int64(1000+i), n)
		if err != nil {
			emit(map[string]interface{}{"event": "dial failed", "target": target, "error": err.Error()})
			cancel()
			return
		}
		if i == 0 && n > 0 {
			emit(map[string]interface{}{"event": "echoed", "bytes": n, "mbPerSec": float64(n) / transfer.Seconds() / 1e6})
		} else {
			lat = append(lat, setup+dial) // connection (single-use) + stream + DIAL_REQ -> DIAL_RSP
		}
		if singleUse {
			conn.Close()
		} else {
			if err := cs.CloseSend(); err != nil {
				fail("CloseSend: %v", err)
			}
			var b []byte
			if err := cs.RecvMsg(&b); err != io.EOF {
				fail("after CLOSE_RSP and CloseSend: expected the stream to end with OK, got %v", err)
			}
		}
		cancel()
	}
	if len(lat) > 0 {
		emit(map[string]interface{}{"event": "dials", "count": len(lat), "p50ms": percentile(lat, 0.5), "p99ms": percentile(lat, 0.99)})
	}
}

// ---------- server ----------

// runServer accepts one Kanal agent with upstream's agent-port gRPC options
// and dials `target` through it.
func runServer(cfg *tls.Config, target string, size int) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("listen: %v", err)
	}
	done := make(chan struct{})
	handler := func(_ interface{}, ss grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		if err := ss.SendHeader(metadata.Pairs("serverid", "grpc-go-peer", "servercount", "1")); err != nil {
			return err
		}
		s := &stream{s: ss}
		emit(map[string]interface{}{"event": "agent connected", "agentID": md.Get("agentid")})
		dial, transfer, err := exchange(s, target, 42, size)
		if err != nil {
			emit(map[string]interface{}{"event": "dial failed", "error": err.Error()})
		} else {
			emit(map[string]interface{}{"event": "echoed", "bytes": size, "dialMs": float64(dial.Microseconds()) / 1000, "mbPerSec": float64(size) / transfer.Seconds() / 1e6})
		}
		// A second dial to a port nobody listens on must be refused, not hang.
		_, _, err = exchange(s, "127.0.0.1:1", 43, 0)
		emit(map[string]interface{}{"event": "refused dial", "error": fmt.Sprint(err)})
		close(done)
		<-ss.Context().Done()
		return nil
	}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(cfg)),
		grpc.CustomCodec(rawCodec{}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Hour}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
	)
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "AgentService",
		HandlerType: (*interface{})(nil),
		Streams:     []grpc.StreamDesc{{StreamName: "Connect", Handler: handler, ServerStreams: true, ClientStreams: true}},
	}, struct{}{})
	emit(map[string]interface{}{"event": "listening", "port": lis.Addr().(*net.TCPAddr).Port})
	go srv.Serve(lis)
	<-done
	srv.Stop()
}

func main() {
	mode := flag.String("mode", "", "agent | client | server")
	addr := flag.String("addr", "", "agent: Kanal's agent port host:port")
	uds := flag.String("uds", "", "client: Kanal's frontend Unix socket")
	target := flag.String("target", "", "client, server: echo server host:port to dial")
	id := flag.String("agent-id", "grpc-go-agent", "agent: agentID metadata")
	ca := flag.String("ca", "", "CA certificate")
	cert := flag.String("cert", "", "certificate")
	key := flag.String("key", "", "key")
	size := flag.Int("bytes", 1<<20, "bytes to echo through the first connection")
	dials := flag.Int("dials", 1, "client: connections to open one after another")
	singleUse := flag.Bool("single-use", false, "client: a new gRPC connection per dial, closed after CLOSE_RSP (the KAS's way)")
	flag.Parse()
	switch *mode {
	case "agent":
		runAgent(*addr, *id, tlsConfig(*ca, *cert, *key, false))
	case "client":
		runClient(*uds, *target, *size, *dials, *singleUse)
	case "server":
		runServer(tlsConfig(*ca, *cert, *key, true), *target, *size)
	default:
		fail("-mode must be agent, client or server")
	}
}
