"""The HTML of the pages (pure): one layout, a shell per page, and the small script that fills
each shell from its JSON endpoint and keeps polling it. Every value is escaped (html.escape on the
server, textContent in the browser)."""

from __future__ import annotations

import html

from hfai.web import assets
from hfai.web.charts import CHARTS_JS

STYLE = """
body{font:14px system-ui,sans-serif;margin:0;color:#222}nav{background:#234;padding:8px 16px}
nav a,nav span{color:#fff;margin-right:16px;text-decoration:none}nav form{display:inline}
main{padding:12px 16px}table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}th{cursor:pointer;background:#f0f0f0}.stale{opacity:.45}
.state-running{color:#070}.state-suspended,.state-suspending{color:#a60}.state-failed{color:#b00}
pre{background:#111;color:#ddd;padding:8px;max-height:420px;overflow:auto}.err{color:#b00}
.timeline li{margin:2px 0}button{cursor:pointer}.ok{color:#070}.note{color:#555;max-width:70em}
h1 small.sub{font-size:60%;font-weight:normal;color:#666;margin-left:8px}.num{text-align:right}
.pair{display:flex;gap:12px;flex-wrap:wrap}.pair>div{flex:1 1 560px;min-width:0}.chart{min-height:120px}
tr.picked{background:#eef4ff}
"""

SCRIPT = r"""
const POLL_MS = %(poll_ms)d;
function el(tag, text, cls){const e=document.createElement(tag); if(text!==undefined) e.textContent=text;
  if(cls) e.className=cls; return e;}
function ago(ts){const s=Math.max(0,Date.now()/1000-ts); return s<120?Math.round(s)+'s':s<7200?
  Math.round(s/60)+'m':Math.round(s/3600)+'h';}
function when(ts){return ts? new Date(ts*1000).toISOString().replace('T',' ').slice(0,19)+'Z':'';}
async function getJSON(url){const r=await fetch(url,{credentials:'same-origin'}); const b=await r.json();
  if(!r.ok) throw new Error(b.error||r.statusText); return b;}
function showError(e){const box=document.getElementById('error'); if(box) box.textContent=e?String(e.message||e):'';}
function poll(fn){const go=async()=>{try{await fn(); showError('');}catch(e){showError(e);} };
  go(); return setInterval(go, POLL_MS);}
"""

JOBS_JS = r"""
let sort='submitted', desc=true;
function query(){const p=new URLSearchParams({sort:sort, desc:desc?'1':'0'});
  for(const f of ['user','state','priority','name']){const v=document.getElementById('f-'+f).value; if(v) p.set(f,v);}
  return p.toString();}
async function load(){const b=await getJSON('/api/jobs?'+query()); const tb=document.getElementById('rows');
  tb.replaceChildren(...b.jobs.map(j=>{const tr=el('tr'); tr.dataset.id=j.id; tr.dataset.state=j.state;
    const a=el('a',j.name); a.href='/jobs/'+encodeURIComponent(j.id); const td=el('td'); td.append(a);
    if(j.kind==='dev' && j.user===ME && j.state==='running'){  // a development session: JupyterLab
      const o=el('a','Open','open'); o.href='/dev/'+encodeURIComponent(j.id)+'/'; o.target='_blank';
      td.append(' ', o);}
    tr.append(el('td',j.id), td, el('td',j.user), el('td',j.priority), el('td',j.state,'state-'+j.state),
      el('td',String(j.nodes)), el('td',String(j.suspends)), el('td',ago(j.submitted)), el('td',j.reason));
    return tr;}));
  document.getElementById('count').textContent=b.jobs.length+' job(s)';}
document.querySelectorAll('th[data-sort]').forEach(th=>th.onclick=()=>{const k=th.dataset.sort;
  if(sort===k) desc=!desc; else {sort=k; desc=false;} load();});
document.querySelectorAll('.filter').forEach(i=>i.oninput=()=>load());
poll(load);
"""

JOB_JS = r"""
const JOB=%(job)s, MAY_ACT=%(may_act)s; let rank=0, offset=0, follow=true;
function link(text, href){const a=el('a', text); a.href=href; return a;}
async function load(){const j=await getJSON('/api/jobs/'+JOB);
  document.getElementById('state').textContent=j.state; document.getElementById('state').className='state-'+j.state;
  document.getElementById('reason').textContent=j.reason;
  // A job not running now shows where it last ran, and says so.
  const nodes=j.on.length?j.on:j.last_nodes, box=document.getElementById('nodes');
  document.getElementById('nodes-label').textContent=!j.on.length&&j.last_nodes.length?'last ran on':'nodes';
  box.replaceChildren(...nodes.flatMap((n,i)=>[...(i?[', ']:[]), link(n, '/nodes?node='+encodeURIComponent(n))]));
  if(!nodes.length) box.textContent='-';
  document.getElementById('spec').textContent=JSON.stringify(j.spec,null,1);
  // Peak memory and CPU time: measured in each run's cgroup (0 where the node has none).
  const gib=b=>b>=2**30?(b/2**30).toFixed(1)+' GiB':Math.round(b/2**20)+' MiB';
  const used=j.peak_bytes||j.cpu_s?` · peak memory ${gib(j.peak_bytes)} · CPU time ${Math.round(j.cpu_s)} s`:'';
  // Its log watchdog (docs/health.md): the time without output that ends it as hung, and its silence.
  const w=j.watchdog, dur=s=>s>=3600?(s/3600).toFixed(1)+' h':s>=60?Math.floor(s/60)+' min':Math.floor(s)+' s';
  const watch=w?` · watchdog ${dur(w.watchdog_s)}, silent for ${dur(w.silent_s)} on ${w.node} at ${when(w.ts)}`:'';
  document.getElementById('meta').textContent=`${j.user} · ${j.group} · ${j.priority} · run ${j.run_id} · `+
    `${j.suspends} suspend(s) · submitted ${when(j.submitted)}${used}${watch}`;
  // Its measured throughput and GPU use per size, its fitted speedup curve (docs/scheduling.md).
  const tp=j.throughput||[];
  document.getElementById('throughput-label').hidden=!tp.length;
  document.getElementById('throughput').replaceChildren(...tp.map(t=>el('li',t)));
  document.getElementById('history').replaceChildren(
    ...j.history.map(e=>el('li',`${when(e.ts)}  ${e.state}  ${e.reason}`)));
  gantt(document.getElementById('timeline'), 'Its nodes over its life: this job and any other that held them',
    j.timeline);
  const g=j.gpu.nodes;
  lineChart(document.getElementById('job-util'), 'GPU utilisation over its runs (mean of each node\'s GPUs)',
    g.map(n=>({name:n.node, ts:n.ts, v:n.util})), 'utilisation (%%)',
    {unit:'%%', yRange:[0,100], t0:j.timeline.t0, t1:j.timeline.t1, empty:'no telemetry of its runs (kept one hour)'});
  lineChart(document.getElementById('job-mem'), 'GPU memory used over its runs (mean of each node\'s GPUs)',
    g.map(n=>({name:n.node, ts:n.ts, v:n.mem})), 'memory used (%% of total)',
    {unit:'%%', yRange:[0,100], t0:j.timeline.t0, t1:j.timeline.t1, empty:'no telemetry of its runs (kept one hour)'});
  if(!MAY_ACT) return;
  const sel=document.getElementById('rank');
  if(sel.options.length!==j.ranks){sel.replaceChildren(...Array.from({length:j.ranks},
    (_,i)=>{const o=el('option','rank '+i); o.value=i; return o;}));}
  document.getElementById('download').href='/jobs/'+JOB+'/logs/'+rank+'/download';
  document.getElementById('stop').disabled=['succeeded','failed','stopped','stopping'].includes(j.state);}
async function logs(){if(!follow) return; const c=await getJSON(`/api/jobs/${JOB}/logs/${rank}?offset=${offset}`);
  if(c.data){const pre=document.getElementById('log'); pre.textContent+=c.data; pre.scrollTop=pre.scrollHeight;}
  offset=c.offset;}
// An action's answer has its own line: the polls' errors (and their clearing) never overwrite it.
function said(text, ok){const p=document.getElementById('action'); p.textContent=text; p.className=ok?'ok':'err';}
if(MAY_ACT){
  document.getElementById('rank').onchange=e=>{rank=+e.target.value; offset=0;
    document.getElementById('log').textContent='';};
  document.getElementById('follow').onchange=e=>{follow=e.target.checked;};
  document.getElementById('stop').onclick=async()=>{if(!confirm('Stop job '+JOB+'?')) return;
    const r=await fetch('/api/jobs/'+JOB+'/stop',{method:'POST',credentials:'same-origin',
      headers:{'X-Requested-With':'hfai-web'}}); const b=await r.json();
    said(r.ok?'stop requested':'not stopped: '+b.error, r.ok); load();};
  poll(logs);
}
poll(load);
"""

ARRAY_JS = r"""
const ARRAY=%(array)s;
async function load(){const b=await getJSON('/api/arrays/'+encodeURIComponent(ARRAY));
  document.getElementById('summary').textContent=b.summary;
  document.getElementById('rows').replaceChildren(...b.jobs.map(j=>{const tr=el('tr'); tr.dataset.id=j.id;
    tr.dataset.state=j.state; const a=el('a',j.name); a.href='/jobs/'+encodeURIComponent(j.id);
    const td=el('td'); td.append(a);
    tr.append(el('td',j.id), td, el('td',j.priority), el('td',j.state,'state-'+j.state),
      el('td',j.on.join(', ')||'-'), el('td',String(j.suspends)), el('td',ago(j.submitted)), el('td',j.reason));
    return tr;}));}
poll(load);
"""

NODES_JS = r"""
const params=new URLSearchParams(location.search);
let picked=params.get('node')||'';
function gib(b){return (b/2**30).toFixed(1);}
function pick(name){picked=name; const u=new URL(location.href); u.searchParams.set('node', name);
  history.replaceState(null,'',u); load();}
async function load(){const b=await getJSON('/api/nodes'+(picked?'?node='+encodeURIComponent(picked):''));
  const box=document.getElementById('nodes');
  box.replaceChildren(...b.nodes.map(n=>{const tr=el('tr'); tr.dataset.node=n.name; tr.id='node-'+n.name;
    tr.className=(n.stale?'stale ':'')+(n.name===b.picked?'picked':'');
    const name=el('td'); const a=el('a', n.name); a.href='?node='+encodeURIComponent(n.name);
    a.onclick=e=>{e.preventDefault(); pick(n.name);}; name.append(a);
    const jobs=el('td'); n.jobs.forEach((j,i)=>{if(i) jobs.append(', '); const l=el('a', j.name);
      l.href='/jobs/'+encodeURIComponent(j.id); l.title='job '+j.id; jobs.append(l);});
    const when_=n.stale?`figures of ${when(n.last_seen)}`:`${ago(n.last_seen)} ago`;
    tr.append(name, el('td',n.state,'state-'+n.state), el('td',n.reason), jobs,
      el('td',`${Math.round(n.util)}%`,'num'), el('td',`${gib(n.mem_used)} / ${gib(n.mem_total)} GiB`,'num'),
      el('td',when_), el('td',n.health)); return tr;}));
  heatMap(document.getElementById('heat-util'), 'GPU utilisation per node, last hour (mean of its GPUs)',
    b.heat, 'util', 'utilisation');
  heatMap(document.getElementById('heat-mem'), 'GPU memory used per node, last hour (mean of its GPUs)',
    b.heat, 'mem', 'memory used');
  const g=b.gpus; document.getElementById('picked').textContent=b.picked||'-';
  const colour=i=>`hsl(${(i*47)%360},65%,42%)`;
  if(b.picked){
    lineChart(document.getElementById('gpu-util'), `${b.picked}: utilisation per GPU, last hour`,
      g.util.map((l,i)=>({name:'GPU '+i, ts:l.ts, v:l.v, colour:colour(i)})), 'utilisation (%)',
      {unit:'%', yRange:[0,100], t0:b.since, t1:b.now, height:280});
    lineChart(document.getElementById('gpu-mem'), `${b.picked}: memory used per GPU, last hour`,
      g.mem.map((l,i)=>({name:'GPU '+i, ts:l.ts, v:l.v, colour:colour(i)})), 'memory used (% of total)',
      {unit:'%', yRange:[0,100], t0:b.since, t1:b.now, height:280});}}
poll(load);
"""

CLUSTER_JS = r"""
function table(id, obj, cols){document.getElementById(id).replaceChildren(...obj.map(r=>{const tr=el('tr');
  tr.append(...cols.map(c=>el('td',String(r[c])))); return tr;}));}
function pairs(id, obj, empty){const rows=Object.entries(obj).map(([k,v])=>({k,v}));
  table(id, rows.length?rows:[{k:empty, v:''}], ['k','v']);}
async function load(){const w=document.getElementById('window').value, b=await getJSON('/api/cluster?window='+w);
  document.getElementById('summary').textContent=`${b.nodes} nodes, ${b.up} up, ${b.busy} busy; `+
    `${b.running} job(s) running, ${b.queued} waiting`;
  const s=b.series;
  stackedChart(document.getElementById('charts'), 'The cluster over the '+s.label, [
    {title:'GPU util (%)', unit:'%', range:[0,100], lines:[{name:'mean GPU utilisation (%)', ts:s.util.ts,
      v:s.util.v, colour:'#1f77b4'}]},
    {title:'jobs waiting', unit:'', counts:true, lines:[{name:'jobs waiting', ts:s.queue.ts, v:s.queue.v,
      colour:'#ff7f0e', shape:'hv'}]},
    {title:'nodes in use', unit:` of ${b.nodes}`, range:[0, Math.max(1,b.nodes)], counts:true,
      lines:[{name:`nodes in use (of ${b.nodes})`, ts:s.used.ts, v:s.used.v, colour:'#2ca02c', shape:'hv'}]}],
    {t0:s.t0, t1:s.t1, height:480});
  gantt(document.getElementById('timeline'), 'Time-sharing: which job held which node, '+s.label, b.timeline,
    {allKinds:true});
  pairs('by-user', b.by_user, 'no node is held'); pairs('by-prio', b.by_priority, 'no node is held');
  document.getElementById('quota-note').textContent=b.quota_note;
  const q=b.quotas.length?b.quotas:[{user:'*', priority:'every level', group:'*', quota:b.quota_default, used:b.busy}];
  table('quotas', q, ['user','priority','group','quota','used']);}
document.getElementById('window').onchange=load;
poll(load);
"""

USAGE_JS = r"""
async function load(){const days=document.getElementById('days').value;
  document.getElementById('csv').href='/usage.csv?days='+days;
  const b=await getJSON('/api/usage?days='+days);
  document.getElementById('rows').replaceChildren(...b.rows.map(r=>{const tr=el('tr');
    tr.append(...[r.day,r.user,r.group,r.priority,r.gpu_hours.toFixed(2),r.runs].map(v=>el('td',String(v))));
    return tr;}));
  for(const k of ['user','group','priority']){document.getElementById('by-'+k).textContent=
    Object.entries(b.totals[k]).map(([n,h])=>`${n}: ${h.toFixed(2)}`).join(' · ')||'-';}
  // Every day of the window, an idle one too, so the bars keep the calendar's spacing.
  const days_=Array.from({length:+days}, (_,i)=>new Date(Date.now()-(days-1-i)*864e5).toISOString().slice(0,10)),
    users=[...new Set(b.rows.map(r=>r.user))].sort();
  barChart(document.getElementById('chart'), `GPU-hours per UTC day and user, last ${days} day(s)`, days_,
    users.map(u=>({name:u, v:days_.map(d=>b.rows.filter(r=>r.day===d&&r.user===u)
      .reduce((s,r)=>s+r.gpu_hours,0))})), 'GPU-hours', 'day (UTC)');}
document.getElementById('days').onchange=load; poll(load);
"""


def layout(title: str, body: str, user: str = "", script: str = "", poll_s: float = 2.0, charts: bool = False,
           heading: str = "", refresh_s: int = 0) -> str:
    """A whole page. ``charts``: load plotly.js (served by hfai-web) and the chart helpers before
    the page's script. ``heading``: the h1 when it should differ from the tab's title (HTML, escaped
    by the caller). ``refresh_s``: the browser reloads the page this often (0: never)."""
    nav = ""
    if user:
        nav = ('<nav><a href="/jobs">Jobs</a><a href="/nodes">Nodes</a><a href="/cluster">Cluster</a>'
               f'<a href="/usage">Usage</a><span id="who">{html.escape(user)}</span>'
               '<form method="post" action="/logout"><button>Sign out</button></form></nav>')
    js = ""
    if script:
        lib = f"<script src='{assets.script_url()}'></script>" if charts else ""
        js = lib + "<script>" + SCRIPT % {"poll_ms": int(poll_s * 1000)} + (CHARTS_JS if charts else "") + \
            script + "</script>"
    meta = f"<meta http-equiv='refresh' content='{int(refresh_s)}'>" if refresh_s else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'>{meta}<title>{html.escape(title)} · hfai</title>"
            f"<style>{STYLE}</style></head><body>{nav}<main><h1>{heading or html.escape(title)}</h1>"
            f"<p id='error' class='err'></p>{body}</main>{js}</body></html>")


def error_page(title: str, text: str, user: str = "", refresh_s: int = 0, text_id: str = "error-text") -> str:
    """What a browser gets where a page cannot be shown (no such job, not yours, the cluster not
    answering): the site's own page, its navigation when signed in, the reason in words."""
    body = (f"<p class='err' id='{text_id}'>{html.escape(text)}</p>"
            "<p><a href='/jobs'>Back to the jobs</a></p>")
    return layout(title, body, user, refresh_s=refresh_s)


def login_page(error: str = "") -> str:
    body = ("<p>Sign in with your hfai credentials: paste your <code>.creds</code> file or choose it.</p>"
            f"<p class='err' id='login-error'>{html.escape(error)}</p>"
            "<form method='post' action='/login' enctype='multipart/form-data'>"
            "<p><input type='file' name='file' id='file'></p>"
            "<p><textarea name='creds' id='creds' rows='8' cols='80' placeholder='-----BEGIN NATS USER JWT-----'>"
            "</textarea></p><p><button id='sign-in'>Sign in</button></p></form>")
    return layout("Sign in", body)


def _filters() -> str:
    states = "".join(f"<option>{s}</option>" for s in ("", "queued", "running", "suspending", "suspended", "stopping",
                                                       "succeeded", "failed", "stopped"))
    return ("<p>user <input class='filter' id='f-user' size='10'> state <select class='filter' id='f-state'>"
            f"{states}</select> priority <input class='filter' id='f-priority' size='8'> name "
            "<input class='filter' id='f-name' size='14'> <span id='count'></span></p>")


def jobs_page(user: str, poll_s: float) -> str:
    heads = "".join(f"<th data-sort='{k}'>{label}</th>" for k, label in (
        ("id", "id"), ("name", "name"), ("user", "user"), ("priority", "priority"), ("state", "state"),
        ("nodes", "nodes"), ("suspends", "suspends"), ("submitted", "age"))) + "<th>why</th>"
    body = _filters() + f"<table id='jobs'><thead><tr>{heads}</tr></thead><tbody id='rows'></tbody></table>"
    import json

    return layout("Jobs", body, user, f"const ME={json.dumps(user)};" + JOBS_JS, poll_s)


def job_page(user: str, job_id: str, poll_s: float, name: str = "", owner: str = "", may_act: bool = False) -> str:
    """The job's page. ``may_act``: the viewer owns the job or is an operator, so Stop, the logs, follow
    and download are shown (the controller checks again at each call)."""
    import json

    if may_act:
        actions = ("<p><span id='nodes-label'>nodes</span>: <span id='nodes'></span> "
                   "<button id='stop'>Stop</button></p><p id='action'></p>")
        logs = ("<h2>Logs</h2><p><select id='rank'></select> <label><input type='checkbox' id='follow' checked>"
                " follow</label> <a id='download' href='#'>download</a></p><pre id='log'></pre>")
    else:
        actions = "<p><span id='nodes-label'>nodes</span>: <span id='nodes'></span></p>"
        logs = (f"<h2>Logs</h2><p class='note' id='no-logs'>Only {html.escape(owner or 'its owner')} and operators "
                "may stop this job or read its logs.</p>")
    heading = (f"{html.escape(name or job_id)} <small class='sub'>job {html.escape(job_id)}"
               f"{' of ' + html.escape(owner) if owner else ''}</small>")
    body = ("<p id='meta'></p><p>state <b id='state'></b> — <span id='reason'></span></p>" + actions +
            "<p id='throughput-label' hidden>measured throughput, per size it ran at:</p>"
            "<ul id='throughput'></ul>" +
            "<h2>Timeline</h2><p class='note'>Each bar is a run on a node; marks: preemptions, time slices, "
            "suspend acknowledgements, resumes (hover for the reason).</p><div id='timeline' class='chart'></div>"
            "<h2>GPUs over its runs</h2><div class='pair'><div id='job-util' class='chart'></div>"
            "<div id='job-mem' class='chart'></div></div>" + logs +
            "<h2>History</h2><ol class='timeline' id='history'></ol><h2>Spec</h2><pre id='spec'></pre>")
    script = JOB_JS % {"job": json.dumps(job_id), "may_act": "true" if may_act else "false"}
    return layout(f"{name or job_id} · job {job_id}", body, user, script, poll_s, charts=True, heading=heading)


def array_page(user: str, array_id: str, poll_s: float, name: str = "", owner: str = "") -> str:
    """A job array's page: the line `hfai status ARRAY` prints about it (how many members are in
    which state) and its members in index order, each linking to its own page."""
    import json

    heading = (f"{html.escape(name or array_id)} <small class='sub'>job array {html.escape(array_id)}"
               f"{' of ' + html.escape(owner) if owner else ''}</small>")
    heads = "".join(f"<th>{h}</th>" for h in ("id", "name", "priority", "state", "on", "suspends", "age", "why"))
    body = (f"<p id='summary'></p><table id='members'><thead><tr>{heads}</tr></thead><tbody id='rows'></tbody>"
            "</table><p class='note'>Stop, hold or release the whole array with its id or name: "
            f"<code>hfai stop {html.escape(array_id)}</code>.</p>")
    script = ARRAY_JS % {"array": json.dumps(array_id)}
    return layout(f"{name or array_id} · job array {array_id}", body, user, script, poll_s, heading=heading)


def nodes_page(user: str, poll_s: float) -> str:
    body = ("<p class='note'>Rows are nodes; the colour is the mean of a node's GPUs over each time step "
            "(hover for the figure; blank: no heartbeat). Pick a node in the table for its GPUs one by one.</p>"
            "<div class='pair'><div id='heat-util' class='chart'></div><div id='heat-mem' class='chart'></div></div>"
            "<h2>GPUs of <span id='picked'></span></h2><div class='pair'><div id='gpu-util' class='chart'></div>"
            "<div id='gpu-mem' class='chart'></div></div>"
            "<h2>Nodes</h2><p class='note'>A down node's last figures are greyed and dated.</p>"
            "<table><thead><tr><th>node</th><th>state</th><th>drained because</th><th>jobs</th><th>GPU util</th>"
            "<th>GPU memory</th><th>last heartbeat</th><th>health</th></tr></thead><tbody id='nodes'></tbody></table>")
    return layout("Nodes", body, user, NODES_JS, poll_s, charts=True)


def cluster_page(user: str, poll_s: float) -> str:
    body = ("<p id='summary'></p><p>show the last <select id='window'><option value='3600' selected>hour</option>"
            "<option value='86400'>day</option></select> (drag on a chart to zoom in on time, double-click to "
            "zoom out)</p><div id='charts' class='chart'></div><h2>Time-sharing timeline</h2>"
            "<p class='note'>Each bar is a job's run on a node, one colour per job; marks: preemptions, time slices, "
            "suspend acknowledgements, resumes (hover for the reason; click a legend entry to hide it).</p>"
            "<div id='timeline' class='chart'></div>"
            "<div class='pair'><div><h2>Nodes held per user</h2><table id='by-user'></table></div>"
            "<div><h2>Nodes held per priority</h2><table id='by-prio'></table></div></div>"
            "<h2>Quotas and use now</h2><p class='note' id='quota-note'></p>"
            "<table><thead><tr><th>user</th><th>priority</th><th>group</th><th>quota (nodes)</th><th>used (nodes)</th>"
            "</tr></thead><tbody id='quotas'></tbody></table>")
    return layout("Cluster", body, user, CLUSTER_JS, poll_s, charts=True)


def usage_page(user: str, poll_s: float) -> str:
    body = ("<p>GPU-hours per UTC day, user, group and priority over the last <select id='days'>"
            "<option>1</option><option selected>7</option><option>30</option><option>90</option></select> day(s). "
            "<a id='csv' href='/usage.csv'>CSV</a></p><p>per user: <span id='by-user'></span></p>"
            "<p>per group: <span id='by-group'></span></p><p>per priority: <span id='by-priority'></span></p>"
            "<div id='chart' class='chart'></div>"
            "<table><thead><tr><th>day</th><th>user</th><th>group</th><th>priority</th><th>GPU-hours</th>"
            "<th>runs</th></tr></thead><tbody id='rows'></tbody></table>")
    return layout("Usage", body, user, USAGE_JS, poll_s, charts=True)
