import BusKit
import BusProtocol
import Foundation
import SwitchboardTestSupport
import Testing

/// Drives a page in headless Chromium (Tests/Browser/drive_page.py, the DevTools protocol
/// over a pipe).
let pageDriver = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .appendingPathComponent("Browser/drive_page.py")
let chromium = "/usr/bin/chromium"

@Suite("The apps' page in a real browser", .serialized)
struct BrowserTests {
    @Test("the page searches \"par\", selects a route and sees its price arrive; after kill -9 of the gateway, up restarts it and the page resumes",
          .enabled(if: FileManager.default.isExecutableFile(atPath: chromium), "skipped: no \(chromium) (Scripts/bootstrap installs it)"))
    func pageInChromium() async throws {
        let folder = try temporaryDirectory("browser")
        let (config, broker) = try writeDeploymentConfig(in: folder)
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path])
        defer { up.stop(grace: 15) }
        let banner = try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 120)
        let gatewayLine = try #require(banner.split(separator: "\n").first { $0.hasPrefix("  gateway ") }, "\(banner)")
        let address = try #require(gatewayLine.split(separator: " ").first { $0.hasPrefix("http://") }.map { String($0.dropLast($0.hasSuffix(",") ? 1 : 0)) })
        // The banner says where the token is, not the token (it ends up in logs).
        let tokenFile = busKeyFolder(in: folder).gatewayTokenFile.path
        let token = try String(contentsOfFile: tokenFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(!banner.contains(token) && gatewayLine.contains("token in \(tokenFile)"), "\(gatewayLine)")
        let url = address + "#token=" + token
        let gatewayPid = try #require(bannerPids(banner)["gateway"])

        let select = """
            const out = document.getElementById('outbound-select'), inb = document.getElementById('inbound-select');
            const before = out.value + '/' + inb.value;
            const pairs = [];
            for (const o of out.options) for (const i of inb.options)
              if (i.value && i.dataset.from === o.dataset.to && i.dataset.to === o.dataset.from && (o.value + '/' + i.value) !== before) pairs.push([o.value, i.value]);
            if (!pairs.length) throw new Error('no other round trip to choose');
            const [o, i] = pairs[PICK];
            // As a person picks: the outbound first (the inbound list narrows to its returns).
            out.value = o; out.dispatchEvent(new Event('change')); inb.value = i;
            document.getElementById('route-form').requestSubmit();
            // The price shown comes from the /pricing/route/current event, not the reply.
            return await waitFor(() => {
              const price = document.getElementById('route-price').textContent;
              return document.getElementById('route').dataset.route === o + '/' + i && /^[0-9.]+ EUR$/.test(price) && (o + '/' + i + ' ' + price);
            }, 'the price of the chosen route');
            """
        let steps: [[String: Any]] = [
            ["name": "the live stream", "js": "return await waitFor(() => document.getElementById('status').textContent === 'live' && 'live', 'live');"],
            ["name": "search par", "js": """
                document.getElementById('country-query').value = 'par';
                document.getElementById('country-form').requestSubmit();
                return await waitFor(() => {
                  const items = [...document.querySelectorAll('#country-results li')].map((li) => li.textContent);
                  return items.some((text) => text.startsWith('France')) && items.join(' | ');
                }, 'France among the results');
                """],
            ["name": "the hiring list, in parts", "js": """
                document.getElementById('items-load').click();
                return await waitFor(() => {
                  const summary = document.getElementById('items-summary').textContent;
                  const lists = document.querySelectorAll('#items details').length;
                  const shown = document.querySelectorAll('#items li').length;
                  return /^320 items in [0-9]+ lists/.test(summary) && shown === 320 && lists > 1 && summary;
                }, 'the whole hiring list');
                """],
            ["name": "the flights and the current route", "js": """
                return await waitFor(() => document.querySelectorAll('#outbound-select option').length > 1
                  && document.getElementById('route-summary').textContent !== '…' && document.getElementById('route-summary').textContent, 'flights');
                """],
            ["name": "select a route: its price arrives", "js": select.replacingOccurrences(of: "PICK", with: "0")],
            ["name": "an outbound chosen: only the inbound flights that return from it are offered; an error never covers the price", "js": """
                const out = document.getElementById('outbound-select'), inb = document.getElementById('inbound-select');
                const shown = out.value;
                let offered = 0;
                for (const candidate of out.options) {
                  out.value = candidate.value; out.dispatchEvent(new Event('change'));
                  for (const option of inb.options) {
                    if (!option.value || option.disabled) continue;
                    if (option.dataset.from !== candidate.dataset.to || option.dataset.to !== candidate.dataset.from)
                      throw new Error('outbound ' + candidate.value + ' offers inbound ' + option.value + ', which does not return from it');
                    offered += 1;
                  }
                }
                out.value = shown; out.dispatchEvent(new Event('change'));
                if (!offered) throw new Error('no inbound offered at all');
                showError('A long error message, as a refused request would show. '.repeat(6));
                window.scrollTo(0, document.documentElement.scrollHeight);
                await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
                const box = document.getElementById('error').getBoundingClientRect();
                const price = document.getElementById('route-price').getBoundingClientRect();
                if (price.bottom > box.top) throw new Error('the error box (top ' + box.top + ') covers the price (bottom ' + price.bottom + ')');
                document.getElementById('error').click();
                return offered + ' inbound choices offered over ' + out.options.length + ' outbound flights';
                """],
            ["name": "no news source chosen yet: the page says so in words", "js": """
                return await waitFor(() => document.getElementById('headlines-status').textContent.startsWith('No news sources chosen yet') &&
                  document.getElementById('headlines-status').textContent, 'the empty state');
                """],
            ["name": "a choice that lost a race says so and shows the winner", "js": """
                // Someone else chooses the route again; once the page has seen it, its view is put
                // back one revision, as if that change had not arrived yet, and the page chooses.
                const shown = state.get('/pricing/route/current');
                await call('pricing', 'route.select', { outboundId: shown.outboundId, ...(shown.inboundId ? { inboundId: shown.inboundId } : {}), revision: shown.revision });
                await waitFor(() => state.get('/pricing/route/current').revision === shown.revision + 1, 'the other choice');
                state.set('/pricing/route/current', shown);
                document.getElementById('route-form').requestSubmit();
                return await waitFor(() => {
                  const notice = document.getElementById('notice');
                  return !notice.classList.contains('hidden') && notice.textContent.startsWith('Someone else changed the route') && notice.textContent;
                }, 'the notice of the lost race');
                """],
            ["name": "a stream's messages pushed to an EventSource, acknowledged over POST /rpc", "js": """
                await call('streams', 'stream.add', { name: 'browser', subjects: ['browser.'] });
                await call('streams', 'consumer.add', { stream: 'browser', name: 'page' });
                await call('streams', 'stream.publish', { subject: 'browser.hello', data: { n: 1 } });
                const message = await new Promise((resolve, reject) => {
                  const source = new EventSource(`/streams/browser/page?max=1&expires=10&access_token=${encodeURIComponent(token)}`);
                  const timer = setTimeout(() => { source.close(); reject(new Error('no message within 15 s')); }, 15000);
                  source.onmessage = (event) => { clearTimeout(timer); source.close(); resolve({ id: event.lastEventId, ...JSON.parse(event.data) }); };
                });
                const acked = await call('streams', 'consumer.ack', { stream: 'browser', consumer: 'page', sequences: [message.sequence] });
                if (message.data.n !== 1 || message.id !== String(message.sequence) || acked.done[0] !== message.sequence) throw new Error(JSON.stringify([message, acked]));
                return `${message.subject} ${message.sequence}, acknowledged`;
                """],
            ["name": "kill -9 the gateway", "run": ["kill", "-9", String(gatewayPid)]],
            ["name": "the page says it reconnected and resynced", "js": """
                return await waitFor(() => document.getElementById('status').textContent === 'resynced' && 'resynced', 'resynced', 60000);
                """],
            ["name": "after the restart, a route selected again: its price arrives", "js": select.replacingOccurrences(of: "PICK", with: "pairs.length - 1")],
        ]
        let stepsFile = folder.appendingPathComponent("steps.json")
        try JSONSerialization.data(withJSONObject: steps).write(to: stepsFile)
        let screenshot = folder.appendingPathComponent("page-failure.png")
        let run = try await runCommand(URL(fileURLWithPath: "/usr/bin/python3"),
                                       [pageDriver.path, chromium, url, screenshot.path, stepsFile.path], seconds: 240)
        #expect(run.status == 0, "the page failed a step (screenshot kept at \(screenshot.path)):\n\(run)")
        let lines = run.stdout.split(separator: "\n").compactMap { try? JSONValue(parsing: Array($0.utf8)) }
        #expect(lines.filter { $0["ok"] == true }.count == steps.count, "\(run.stdout)")

        // What the page showed last is what the bus holds.
        let shown = lines.last?["value"]?.stringValue ?? ""
        let bus = try await BusClient(brokers: [broker], timeout: .seconds(10), curve: try busKeyFolder(in: folder).clientKeys())
        let current = try await bus.request(service: "pricing", method: "route.current")
        let total = "\(current["total"]?["amount"]?.stringValue ?? "?") \(current["total"]?["currency"]?.stringValue ?? "?")"
        #expect(shown.hasSuffix(total), "page: \(shown), bus: \(current)")
        #expect(up.outputSoFar.contains("gateway (pid \(gatewayPid)) was killed by signal 9"), "up restarted the gateway")
        await bus.close()
        up.signal(SIGTERM)
        #expect(await up.exit(within: 30))
    }
}
