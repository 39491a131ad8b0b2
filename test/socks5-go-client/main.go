// A Go client dialling through SOCKS5 with golang.org/x/net/proxy, the
// library Go programs use for `socks5://` proxies (test/interop/socks5-go.test.ts).
// It fetches -url with net/http over the proxy's dialer and prints the body;
// a failure is printed to stderr with exit code 1.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/net/proxy"
)

func main() {
	network := flag.String("network", "tcp", "how to reach the proxy: tcp or unix")
	address := flag.String("proxy", "", "the SOCKS5 proxy's host:port or socket path")
	user := flag.String("user", "", "RFC 1929 username (with -password)")
	password := flag.String("password", "", "RFC 1929 password: the token")
	url := flag.String("url", "", "what to GET through the proxy")
	flag.Parse()

	var auth *proxy.Auth
	if *user != "" || *password != "" {
		auth = &proxy.Auth{User: *user, Password: *password}
	}
	dialer, err := proxy.SOCKS5(*network, *address, auth, &net.Dialer{Timeout: 10 * time.Second})
	if err != nil {
		fail(err)
	}
	client := &http.Client{
		Timeout: 20 * time.Second,
		Transport: &http.Transport{
			Dial:              dialer.Dial,
			DisableKeepAlives: true,
		},
	}
	res, err := client.Get(*url)
	if err != nil {
		fail(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		fail(err)
	}
	fmt.Print(string(body))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
