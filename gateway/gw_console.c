/*  gw_console - see gw_console.h */
#include "gw_console.h"
#include "gw_pages.h"
#include "sbx_api.h"

#include <assert.h>

static const char *s_str (const json_t *object, const char *name)
{
    const char *value = json_string_value (json_object_get (object, name));
    return value ? value : "";
}

//  A hidden CSRF field and an action button, as one form posting to /account.
static void s_button (FILE *out, const char *csrf, const char *field, const char *value,
                      const char *action, const char *label, const char *confirm)
{
    fputs ("<form method=\"post\" action=\"/account\" class=\"inline\">"
           "<input type=\"hidden\" name=\"csrf\" value=\"",
           out);
    gw_pages_put (out, csrf);
    fputs ("\"><input type=\"hidden\" name=\"", out);
    gw_pages_put (out, field);
    fputs ("\" value=\"", out);
    gw_pages_put (out, value);
    fprintf (out, "\"><button type=\"submit\" name=\"action\" value=\"%s\"", action);
    if (confirm) {
        fputs (" data-confirm=\"", out);
        gw_pages_put (out, confirm);
        fputs ("\"", out);
    }
    fprintf (out, ">%s</button></form>", label);
}

//  A block of text to copy: <pre id> and its Copy button (console.js).
static void s_snippet (FILE *out, const char *id, const char *text)
{
    fprintf (out, "<div class=\"snippet\"><pre id=\"%s\"><code>", id);
    gw_pages_put (out, text);
    fprintf (out,
             "</code></pre><button type=\"button\" class=\"copy\" data-copy=\"%s\">Copy</button>"
             "</div>\n",
             id);
}

static void s_duration (FILE *out, json_int_t seconds)
{
    if (seconds >= 3600)
        fprintf (out, "%lld h %02lld min", (long long) (seconds / 3600),
                 (long long) (seconds % 3600 / 60));
    else if (seconds >= 60)
        fprintf (out, "%lld min %lld s", (long long) (seconds / 60), (long long) (seconds % 60));
    else
        fprintf (out, "%lld s", (long long) seconds);
}

//  A sandbox's last samples (get_sandbox_metrics' answer) as CPU and memory sparklines.
static void s_sparks (FILE *out, const json_t *metrics)
{
    json_t *samples = json_object_get (metrics, "samples");
    size_t count = json_array_size (samples);
    if (!count) {
        fputs ("<span class=\"muted\">—</span>", out);
        return;
    }
    double *cpu = calloc (count, sizeof *cpu), *memory = calloc (count, sizeof *memory);
    size_t i;
    json_t *sample;
    json_array_foreach (samples, i, sample)
    {
        if (!cpu || !memory)
            break;
        cpu[i] = json_number_value (json_object_get (sample, "cpuPercent"));
        memory[i] = (double) json_integer_value (json_object_get (sample, "memoryUsedBytes"));
    }
    double total = (double) json_integer_value (json_object_get (metrics, "memoryTotalBytes"));
    char label[96], used[24], of[24];
    if (cpu && memory) {
        snprintf (label, sizeof label, "CPU %.1f%%",
                  json_number_value (json_object_get (metrics, "cpuPercent")));
        gw_chart_spark (out, "cpu", label, cpu, count, 100);
        if (total > 0) {
            snprintf (label, sizeof label, "memory %s of %s",
                      sbx_api_bytes ((uint64_t) memory[count - 1], used, sizeof used),
                      sbx_api_bytes ((uint64_t) total, of, sizeof of));
            fputs ("<br>", out);
            gw_chart_spark (out, "memory", label, memory, count, total);
        }
    }
    free (cpu);
    free (memory);
}

static void s_sandboxes (FILE *out, const gw_console_page_t *p)
{
    fputs ("<section id=\"sandboxes\"><h2>Sandboxes</h2>\n", out);
    if (!p->sandboxes) {
        fputs ("<p class=\"muted\">", out);
        gw_pages_put (out, p->sandboxes_error);
        fputs ("</p></section>\n", out);
        return;
    }
    if (!json_array_size (p->sandboxes)) {
        fputs ("<p class=\"muted\">No sandboxes yet. Create one from an MCP client, the CLI "
               "(<code>sbx sandbox create</code>) or an SDK: see Connect below.</p>"
               "</section>\n",
               out);
        return;
    }
    fputs ("<table><tr><th>Name</th><th>State</th><th>Type</th><th>URL and ports</th>"
           "<th>CPU and memory</th><th>Running time</th><th>Cost so far</th><th></th></tr>\n",
           out);
    size_t i;
    const json_t *s;
    json_array_foreach (p->sandboxes, i, s)
    {
        const char *id = s_str (s, "id"), *state = s_str (s, "state");
        fputs ("<tr class=\"sandbox\" id=\"sandbox-", out);
        gw_pages_put (out, id);
        fputs ("\" data-id=\"", out);
        gw_pages_put (out, id);
        fputs ("\" data-state=\"", out);
        gw_pages_put (out, state);
        fputs ("\"><td>", out);
        gw_pages_put (out, s_str (s, "name"));
        fputs ("<br><span class=\"muted\"><code>", out);
        gw_pages_put (out, id);
        fputs ("</code></span></td><td class=\"state\">", out);
        gw_pages_put (out, state);
        if (*s_str (s, "reason")) {
            fputs ("<br><span class=\"error\">", out);
            gw_pages_put (out, s_str (s, "reason"));
            fputs ("</span>", out);
        }
        fputs ("</td><td>", out);
        gw_pages_put (out, s_str (s, "type"));
        fputs ("</td><td><a class=\"url\" href=\"", out);
        const char *owner_url = s_str (s, "ownerUrl");
        gw_pages_put (out, *owner_url ? owner_url : s_str (s, "url"));
        fputs ("\" target=\"_blank\" rel=\"noopener\">", out);
        gw_pages_put (out, s_str (s, "url"));
        fputs ("</a>", out);
        size_t k;
        const json_t *port;
        json_array_foreach (json_object_get (s, "ports"), k, port)
        {
            fprintf (out, "<br><span class=\"port\" data-port=\"%lld\">port %lld: ",
                     (long long) json_integer_value (json_object_get (port, "port")),
                     (long long) json_integer_value (json_object_get (port, "port")));
            fputs ("<a href=\"", out);
            gw_pages_put (out, s_str (port, "url"));
            fputs ("\" target=\"_blank\" rel=\"noopener\">", out);
            gw_pages_put (out, s_str (port, "url"));
            fprintf (out, "</a> (%s)</span>",
                     json_is_true (json_object_get (port, "public")) ? "public" : "private");
        }
        fputs ("</td><td class=\"metrics\">", out);
        s_sparks (out, json_object_get (s, "metrics"));
        json_t *seconds = json_object_get (s, "runningSeconds");
        if (json_is_integer (seconds)) {
            fprintf (out, "</td><td class=\"running\" data-seconds=\"%lld\">",
                     (long long) json_integer_value (seconds));
            s_duration (out, json_integer_value (seconds));
            fputs ("</td><td class=\"cost\">$", out);
            gw_pages_put (out, s_str (s, "costUsd"));
        } else
            fputs ("</td><td class=\"running muted\">not known now</td><td class=\"cost\">", out);
        fputs ("</td><td class=\"actions\">", out);
        if (streq (state, "ready"))
            s_button (out, p->csrf, "sandbox_id", id, "stop", "Stop", NULL);
        else if (streq (state, "stopped"))
            s_button (out, p->csrf, "sandbox_id", id, "resume", "Resume", NULL);
        if (!streq (state, "deleting") && !streq (state, "deleted"))
            s_button (out, p->csrf, "sandbox_id", id, "delete", "Delete",
                      "Delete this sandbox? Its disk and memory are removed for good.");
        fputs ("</td></tr>\n", out);
    }
    fputs ("</table>\n", out);
    if (p->sandboxes_more)
        fprintf (out,
                 "<p class=\"more\">The newest %zu are shown; <code>sbx sandbox list</code> "
                 "and the REST API list every one.</p>\n",
                 json_array_size (p->sandboxes));
    fputs ("<p class=\"muted\">Stopped sandboxes keep their memory and bill "
           "nothing until resumed. A sandbox's URL shows its published ports to you.</p>"
           "</section>\n",
           out);
}

static void s_snapshots (FILE *out, const gw_console_page_t *p)
{
    fputs ("<section id=\"snapshots\"><h2>Snapshots</h2>\n", out);
    if (!p->snapshots) {
        fputs ("<p class=\"muted\">", out);
        gw_pages_put (out, p->snapshots_error);
        fputs ("</p></section>\n", out);
        return;
    }
    if (!json_array_size (p->snapshots)) {
        fputs ("<p class=\"muted\">No snapshots. <code>save_snapshot</code> (MCP), "
               "<code>sbx snapshot save</code> or an SDK's <code>snapshot()</code> makes one."
               "</p></section>\n",
               out);
        return;
    }
    fputs ("<table><tr><th>Name</th><th>State</th><th>Kind</th><th>From</th><th>Size</th>"
           "<th>Created</th><th></th></tr>\n",
           out);
    size_t i;
    const json_t *s;
    json_array_foreach (p->snapshots, i, s)
    {
        const char *id = s_str (s, "id");
        fputs ("<tr class=\"snapshot\" data-id=\"", out);
        gw_pages_put (out, id);
        fputs ("\"><td>", out);
        gw_pages_put (out, *s_str (s, "name") ? s_str (s, "name") : id);
        fputs ("<br><span class=\"muted\"><code>", out);
        gw_pages_put (out, id);
        fputs ("</code></span></td><td>", out);
        gw_pages_put (out, s_str (s, "state"));
        fputs ("</td><td>", out);
        gw_pages_put (out, s_str (s, "kind"));
        fputs ("</td><td><code>", out);
        gw_pages_put (out, s_str (s, "sandboxId"));
        fprintf (out, "</code></td><td>%.1f MiB</td><td>",
                 (double) json_integer_value (json_object_get (s, "sizeBytes")) / 1048576.0);
        gw_pages_put (out, s_str (s, "createdAt"));
        fputs ("</td><td>", out);
        s_button (out, p->csrf, "snapshot_id", id, "delete_snapshot", "Delete",
                  "Delete this snapshot and its files?");
        fputs ("</td></tr>\n", out);
    }
    fputs ("</table></section>\n", out);
}

static void s_usage (FILE *out, const gw_console_page_t *p)
{
    const gw_console_usage_t *usage = p->usage;
    fputs ("<section id=\"usage\"><h2>Usage and wallets</h2>\n", out);
    if (!usage || usage->unavailable) {
        fputs ("<p class=\"muted\">", out);
        gw_pages_put (out, usage ? usage->unavailable : "Usage is not available right now.");
        fputs ("</p></section>\n", out);
        return;
    }
    fprintf (out, "<p id=\"usage-total\">Running time: %llu s, costing ",
             (unsigned long long) usage->seconds);
    gw_pages_put (out, usage->cost);
    fputs (". Balance of the active wallet: <strong id=\"balance\">", out);
    gw_pages_put (out, usage->balance);
    fputs ("</strong>.</p>\n<div class=\"charts\">", out);
    gw_chart_write (out, "chart-14", "Last 14 days", usage->days, usage->day_count, p->today, 14);
    gw_chart_write (out, "chart-30", "Last 30 days", usage->days, usage->day_count, p->today, 30);
    fputs ("</div>\n<table><tr><th>Wallet</th><th>Balance</th><th></th></tr>\n", out);
    for (size_t i = 0; i < usage->wallet_count; i++) {
        fputs ("<tr><td>", out);
        gw_pages_put (out, usage->wallets[i].name);
        fputs ("</td><td>", out);
        gw_pages_put (out, usage->wallets[i].balance);
        fprintf (out, "</td><td>%s</td></tr>\n",
                 usage->wallets[i].active ? "active: charges go here" : "");
    }
    fputs ("</table></section>\n", out);
}

static void s_keys (FILE *out, const gw_console_page_t *p)
{
    fputs ("<section id=\"keys\"><h2>API keys and connections</h2>\n", out);
    if (p->new_key) {
        fputs ("<div class=\"new-key\" role=\"status\"><p><strong>Your new API key</strong>, "
               "shown only now: copy it and keep it safe.</p>",
               out);
        s_snippet (out, "new-key", p->new_key);
        fputs ("</div>\n", out);
    }
    if (p->keys_error) {
        fputs ("<p class=\"muted\">", out);
        gw_pages_put (out, p->keys_error);
        fputs ("</p>\n", out);
    } else {
        fputs ("<table><tr><th>Name</th><th>Kind</th><th>Created</th><th>Last used</th>"
               "<th></th></tr>\n",
               out);
        for (size_t i = 0; i < p->key_count; i++) {
            const gw_console_key_t *k = &p->keys[i];
            bool connection = k->kind && streq (k->kind, "connection");
            fputs ("<tr class=\"key\" data-id=\"", out);
            gw_pages_put (out, k->key_id);
            fputs ("\"><td>", out);
            gw_pages_put (out, k->name && *k->name ? k->name : k->key_id);
            fputs (" <span class=\"muted\"><code>", out);
            gw_pages_put (out, k->key_id);
            if (k->prefix) {
                fputs (" ", out);
                gw_pages_put (out, k->prefix);
                fputs ("…", out);
            }
            fputs ("</code></span></td><td>", out);
            gw_pages_put (out, connection ? "connection" : k->preset ? k->preset : "api key");
            fputs ("</td><td>", out);
            gw_pages_put (out, k->created);
            fputs ("</td><td>", out);
            gw_pages_put (out, k->last_used);
            fputs ("</td><td>", out);
            if (k->revoked)
                fputs (connection ? "disconnected" : "revoked", out);
            else
                s_button (out, p->csrf, "key_id", k->key_id, "revoke",
                          connection ? "Disconnect" : "Revoke", NULL);
            fputs ("</td></tr>\n", out);
        }
        fputs ("</table>\n", out);
    }
    fputs ("<h3>Create an API key</h3>\n"
           "<form method=\"post\" action=\"/account\"><input type=\"hidden\" name=\"csrf\" "
           "value=\"",
           out);
    gw_pages_put (out, p->csrf);
    fputs ("\"><label for=\"name\">Name</label><input type=\"text\" id=\"name\" name=\"name\" "
           "maxlength=\"100\">\n<label for=\"preset\">What it may do</label>"
           "<select id=\"preset\" name=\"preset\"><option value=\"full\">full</option>"
           "<option value=\"ci\">ci: delete only what it created</option>"
           "<option value=\"read-only\">read-only</option>"
           "<option value=\"no-delete\">no-delete</option></select>\n"
           "<button type=\"submit\" name=\"action\" value=\"create\">Create key</button></form>\n"
           "</section>\n",
           out);
}

//  The snippets, each as its client takes it, with this service's URL.
static void s_connect (FILE *out, const gw_console_page_t *p)
{
    const char *base = p->base_url ? p->base_url : "https://localhost";
    char mcp[600], text[2400];
    snprintf (mcp, sizeof mcp, "%s/mcp", base);
    fputs ("<section id=\"connect\"><h2>Connect</h2>\n<p>The MCP endpoint of this service:</p>",
           out);
    s_snippet (out, "snippet-mcp-url", mcp);
    fputs ("<h3>Claude</h3><p>Customize &gt; Connectors &gt; + Add &gt; Add custom "
           "connector: name it sbx, this URL, Continue, Add; sign in here and click "
           "Allow.</p>",
           out);
    s_snippet (out, "snippet-claude", mcp);
    fputs ("<h3>ChatGPT</h3><p>Plugins &gt; + &gt; Add custom MCP server: this URL, "
           "authentication OAuth, client fields empty; create, install, sign in here and "
           "click Allow.</p>",
           out);
    s_snippet (out, "snippet-chatgpt", mcp);
    fputs ("<h3>Claude Code</h3><p>Signs in here on first use (<code>/mcp</code> in Claude "
           "Code), or add <code>--header \"Authorization: Bearer sbx_…\"</code> with an API "
           "key.</p>",
           out);
    snprintf (text, sizeof text, "claude mcp add --transport http sbx %s", mcp);
    s_snippet (out, "snippet-claude-code", text);
    fputs ("<h3>Cursor</h3><p><code>~/.cursor/mcp.json</code>, with an API key of yours:</p>", out);
    snprintf (text, sizeof text,
              "{\n  \"mcpServers\": {\n    \"sbx\": {\n      \"url\": \"%s\",\n"
              "      \"headers\": { \"Authorization\": \"Bearer sbx_…\" }\n    }\n  }\n}",
              mcp);
    s_snippet (out, "snippet-cursor", text);
    fputs ("<h3>Python SDK</h3>", out);
    snprintf (text, sizeof text,
              "pip install ./sdk/python   # from a checkout of sbx\n"
              "export SBX_URL=%s SBX_API_KEY=sbx_…\n\n"
              "from sbx import Sandbox\n\n"
              "with Sandbox.create(name=\"demo\") as sb:\n"
              "    print(sb.commands.run(\"uname -a\").stdout)",
              base);
    s_snippet (out, "snippet-python", text);
    fputs ("<h3>TypeScript SDK</h3>", out);
    snprintf (text, sizeof text,
              "npm install ./sdk/typescript   # from a checkout of sbx\n"
              "export SBX_URL=%s SBX_API_KEY=sbx_…\n\n"
              "import { Sandbox } from \"sbx-sdk\";\n\n"
              "const sb = await Sandbox.create({ name: \"demo\" });\n"
              "console.log((await sb.commands.run(\"uname -a\")).stdout);\n"
              "await sb.kill();",
              base);
    s_snippet (out, "snippet-typescript", text);
    fputs ("<p class=\"muted\">When this service's certificate comes from its own CA, clients "
           "must trust it: <code>SBX_CA_CERT</code> for the SDKs, "
           "<code>NODE_EXTRA_CA_CERTS</code> for Node.js clients (the <code>ca_cert</code> "
           "that <code>sbx status</code> names on the host).</p></section>\n",
           out);
}

char *gw_console_page (const gw_console_page_t *p)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = gw_pages_open (&page, &size, "Your sbx account");
    if (!out)
        return NULL;
    //  Wider than the sign-in pages: tables of sandboxes.
    fputs ("<style>body{max-width:72rem}.inline{display:inline}.inline button{margin:0 .3rem 0 0;"
           "padding:.2rem .6rem}.snippet{display:flex;gap:.5rem;align-items:flex-start}"
           ".snippet pre{flex:1;background:#f4f4f4;padding:.5rem;margin:.3rem 0;overflow-x:auto}"
           ".snippet button{margin:.3rem 0}.charts{display:flex;flex-wrap:wrap;gap:1rem}"
           ".chart{flex:1 1 30rem;margin:0}.chart svg{width:100%;height:auto}"
           ".spark{white-space:nowrap}.spark svg{vertical-align:middle;color:#3b7dd8}"
           ".new-key{border:2px solid #3b7dd8;padding:.5rem 1rem;margin:1rem 0}</style>\n"
           "<script src=\"/account/console.js\" defer></script>\n",
           out);
    fputs ("<header><h1>Your sbx account</h1>\n<p>Signed in as <strong id=\"signed-in\">", out);
    gw_pages_put (out, p->email);
    fputs ("</strong>. <a href=\"#sandboxes\">Sandboxes</a> · <a href=\"#snapshots\">"
           "Snapshots</a> · <a href=\"#usage\">Usage</a> · <a href=\"#keys\">Keys</a> · "
           "<a href=\"#connect\">Connect</a></p>",
           out);
    s_button (out, p->csrf, "signout", "1", "signout", "Sign out", NULL);
    fputs ("</header>\n", out);
    if (p->notice) {
        fputs ("<p role=\"status\" id=\"notice\">", out);
        gw_pages_put (out, p->notice);
        fputs ("</p>\n", out);
    }
    s_sandboxes (out, p);
    s_snapshots (out, p);
    s_usage (out, p);
    s_keys (out, p);
    s_connect (out, p);
    return gw_pages_close (out, &page);
}

void gw_console_test (bool verbose)
{
    (void) verbose;
    gw_console_key_t keys[] = {
        {"key_1", "connection", "Claude (MCP)", "full", NULL, "c", "u", false},
        {"key_2", "api_key", "<ci>", "ci", "sbx_abcd", "c", "", true}};
    gw_console_wallet_t wallets[] = {{"main", "$0.000000", false}, {"<team>", "$4.990000", true}};
    gw_chart_day_t days[] = {{"2026-11-29", 10, "$0.000100"}, {"2026-11-30", 20, "$0.000200"}};
    gw_console_usage_t usage = {.seconds = 30,
                                .cost = "$0.000300",
                                .balance = "$4.990000",
                                .wallets = wallets,
                                .wallet_count = 2,
                                .days = days,
                                .day_count = 2};
    json_t *sandboxes = json_pack (
        "[{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:[{s:i, s:s, s:b}]}, {s:s, s:s, s:s}]", "id",
        "sb_0123456789", "name", "<b>demo</b>", "state", "ready", "type", "small", "url",
        "https://calm-otter.box.localhost", "ownerUrl",
        "https://calm-otter.box.localhost/?sbx_owner=t", "runningSeconds", (json_int_t) 3725,
        "costUsd", "0.037250", "ports", "port", 8000, "url",
        "https://calm-otter-8000.box.localhost", "public", 1, "id", "sb_stopped00", "state",
        "stopped", "name", "other");
    //  The ready one's last samples: CPU and memory sparklines, the newest figures beside.
    json_object_set_new (json_array_get (sandboxes, 0), "metrics",
                         json_pack ("{s:f, s:I, s:[{s:f, s:I}, {s:f, s:I}]}", "cpuPercent", 12.5,
                                    "memoryTotalBytes", (json_int_t) 512 << 20, "samples",
                                    "cpuPercent", 3.0, "memoryUsedBytes", (json_int_t) 100 << 20,
                                    "cpuPercent", 12.5, "memoryUsedBytes", (json_int_t) 120 << 20));
    json_t *snapshots =
        json_pack ("[{s:s, s:s, s:s, s:I}]", "id", "snap_0123456789", "name", "after setup",
                   "state", "ready", "sizeBytes", (json_int_t) 2097152);
    gw_console_page_t p = {.csrf = "tok\"",
                           .email = "a@example.com",
                           .base_url = "https://sbx.example.com",
                           .today = "2026-11-30",
                           .usage = &usage,
                           .sandboxes = sandboxes,
                           .snapshots = snapshots,
                           .keys = keys,
                           .key_count = 2,
                           .new_key = "sbx_new"};
    char *page = gw_console_page (&p);
    assert (page);
    assert (strstr (page, "Disconnect") && strstr (page, "revoked"));
    assert (strstr (page, "<pre id=\"new-key\"><code>sbx_new</code></pre>"));
    assert (strstr (page, "data-copy=\"new-key\""));
    assert (strstr (page, "<strong id=\"balance\">$4.990000</strong>"));
    assert (strstr (page, "&lt;team&gt;") && strstr (page, "&lt;ci&gt;"));
    assert (strstr (page, "&lt;b&gt;demo&lt;/b&gt;") && !strstr (page, "<b>demo"));
    assert (strstr (page, "value=\"tok&quot;\""));
    assert (strstr (page, "data-state=\"ready\"") && strstr (page, "value=\"stop\""));
    assert (strstr (page, "<span class=\"spark cpu\">") && strstr (page, "CPU 12.5%</span>"));
    assert (strstr (page, "<title>memory 120 MiB of 512 MiB</title>"));
    assert (strstr (page, "data-state=\"stopped\"") && strstr (page, "value=\"resume\""));
    assert (strstr (page, "href=\"https://calm-otter.box.localhost/?sbx_owner=t\""));
    assert (strstr (page, "data-seconds=\"3725\">1 h 02 min") && strstr (page, "$0.037250"));
    assert (strstr (page, "port 8000: ") && strstr (page, "(public)"));
    assert (strstr (page, "value=\"delete_snapshot\"") && strstr (page, "2.0 MiB"));
    assert (strstr (page, "id=\"chart-14\"") && strstr (page, "id=\"chart-30\""));
    assert (strstr (page, "claude mcp add --transport http sbx https://sbx.example.com/mcp"));
    assert (strstr (page, "&quot;url&quot;: &quot;https://sbx.example.com/mcp&quot;"));
    assert (strstr (page, "SBX_URL=https://sbx.example.com SBX_API_KEY"));
    assert (strstr (page, "<script src=\"/account/console.js\" defer></script>"));
    assert (!strstr (page, "The newest"));
    free (page);
    //  More than the first page: said, with where to see them all.
    p.sandboxes_more = true;
    page = gw_console_page (&p);
    assert (strstr (page, "The newest 2 are shown"));
    free (page);
    //  Lists that could not be had say why; the rest of the page is still there.
    p = (gw_console_page_t){.csrf = "t",
                            .email = "a@example.com",
                            .today = "2026-11-30",
                            .usage = &(gw_console_usage_t){.unavailable = "Billing is down."},
                            .sandboxes_error = "Sandboxes <cannot> be listed now.",
                            .snapshots_error = "No snapshots now.",
                            .keys_error = "Keys later."};
    page = gw_console_page (&p);
    assert (strstr (page, "Sandboxes &lt;cannot&gt; be listed now.") &&
            strstr (page, "Billing is down.") && strstr (page, "Keys later.") &&
            strstr (page, "id=\"connect\"") && !strstr (page, "chart-14"));
    free (page);
    json_decref (sandboxes);
    json_decref (snapshots);
    assert (gw_console_js_size > 100 && strstr (gw_console_js, "navigator.clipboard"));
}
