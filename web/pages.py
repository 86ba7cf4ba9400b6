"""The HTML of the pages (pure): one layout, a shell per page, and the small script that fills
each shell from its JSON endpoint and keeps polling it. Every value is escaped (html.escape on the
server, textContent in the browser)."""

from __future__ import annotations

import html

STYLE = """
body{font:14px system-ui,sans-serif;margin:0;color:#222}nav{background:#234;padding:8px 16px}
nav a,nav span{color:#fff;margin-right:16px;text-decoration:none}nav form{display:inline}
main{padding:12px 16px}table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}th{cursor:pointer;background:#f0f0f0}.stale{opacity:.45}
.state-running{color:#070}.state-suspended,.state-suspending{color:#a60}.state-failed{color:#b00}
pre{background:#111;color:#ddd;padding:8px;max-height:420px;overflow:auto}.err{color:#b00}
.timeline li{margin:2px 0}button{cursor:pointer}
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
const JOB=%(job)s; let rank=0, offset=0, follow=true;
async function load(){const j=await getJSON('/api/jobs/'+JOB);
  document.getElementById('state').textContent=j.state; document.getElementById('state').className='state-'+j.state;
  document.getElementById('reason').textContent=j.reason;
  document.getElementById('nodes').textContent=(j.on.length?j.on:j.last_nodes).join(', ')||'-';
  document.getElementById('spec').textContent=JSON.stringify(j.spec,null,1);
  document.getElementById('meta').textContent=`${j.user} · ${j.group} · ${j.priority} · run ${j.run_id} · `+
    `${j.suspends} suspend(s) · submitted ${when(j.submitted)}`;
  document.getElementById('history').replaceChildren(
    ...j.history.map(e=>el('li',`${when(e.ts)}  ${e.state}  ${e.reason}`)));
  const sel=document.getElementById('rank');
  if(sel.options.length!==j.ranks){sel.replaceChildren(...Array.from({length:j.ranks},
    (_,i)=>{const o=el('option','rank '+i); o.value=i; return o;}));}
  document.getElementById('download').href='/jobs/'+JOB+'/logs/'+rank+'/download';
  document.getElementById('stop').disabled=['succeeded','failed','stopped','stopping'].includes(j.state);}
async function logs(){if(!follow) return; const c=await getJSON(`/api/jobs/${JOB}/logs/${rank}?offset=${offset}`);
  if(c.data){const pre=document.getElementById('log'); pre.textContent+=c.data; pre.scrollTop=pre.scrollHeight;}
  offset=c.offset;}
document.getElementById('rank').onchange=e=>{rank=+e.target.value; offset=0;
  document.getElementById('log').textContent='';};
document.getElementById('follow').onchange=e=>{follow=e.target.checked;};
document.getElementById('stop').onclick=async()=>{if(!confirm('Stop job '+JOB+'?')) return;
  const r=await fetch('/api/jobs/'+JOB+'/stop',{method:'POST',credentials:'same-origin',
    headers:{'X-Requested-With':'hfai-web'}}); const b=await r.json(); showError(r.ok?'':b.error); load();};
poll(load); poll(logs);
"""

NODES_JS = r"""
async function load(){const b=await getJSON('/api/nodes'); const box=document.getElementById('nodes');
  box.replaceChildren(...b.nodes.map(n=>{const tr=el('tr'); tr.dataset.node=n.name; if(n.stale) tr.className='stale';
    const charts=el('td'); charts.innerHTML=n.util_svg+n.mem_svg;  // server-made SVG, escaped there
    const seen=n.stale?`figures of ${when(n.last_seen)}`:`${Math.round(n.util)}% GPU, ${ago(n.last_seen)} ago`;
    tr.append(el('td',n.name), el('td',n.state,'state-'+n.state), el('td',n.reason), el('td',n.jobs.join(', ')),
      el('td',seen), charts); return tr;}));}
poll(load);
"""

CLUSTER_JS = r"""
function table(id, obj, cols){document.getElementById(id).replaceChildren(...obj.map(r=>{const tr=el('tr');
  tr.append(...cols.map(c=>el('td',String(r[c])))); return tr;}));}
async function load(){const b=await getJSON('/api/cluster');
  document.getElementById('summary').textContent=`${b.nodes} nodes, ${b.up} up, ${b.busy} busy; `+
    `${b.running} job(s) running, ${b.queued} waiting`;
  document.getElementById('charts').innerHTML=b.util_svg+b.queue_svg+b.used_svg;  // server-made SVG
  table('by-user', Object.entries(b.by_user).map(([k,v])=>({k,v})), ['k','v']);
  table('by-prio', Object.entries(b.by_priority).map(([k,v])=>({k,v})), ['k','v']);
  table('quotas', b.quotas, ['user','priority','group','quota','used']);}
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
    Object.entries(b.totals[k]).map(([n,h])=>`${n}: ${h.toFixed(2)}`).join(' · ')||'-';}}
document.getElementById('days').onchange=load; poll(load);
"""


def layout(title: str, body: str, user: str = "", script: str = "", poll_s: float = 2.0) -> str:
    nav = ""
    if user:
        nav = ('<nav><a href="/jobs">Jobs</a><a href="/nodes">Nodes</a><a href="/cluster">Cluster</a>'
               f'<a href="/usage">Usage</a><span id="who">{html.escape(user)}</span>'
               '<form method="post" action="/logout"><button>Sign out</button></form></nav>')
    js = ""
    if script:
        js = "<script>" + SCRIPT % {"poll_ms": int(poll_s * 1000)} + script + "</script>"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} · hfai</title>"
            f"<style>{STYLE}</style></head><body>{nav}<main><h1>{html.escape(title)}</h1>"
            f"<p id='error' class='err'></p>{body}</main>{js}</body></html>")


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
    return layout("Jobs", body, user, JOBS_JS, poll_s)


def job_page(user: str, job_id: str, poll_s: float) -> str:
    import json

    body = ("<p id='meta'></p><p>state <b id='state'></b> — <span id='reason'></span></p>"
            "<p>nodes: <span id='nodes'></span> <button id='stop'>Stop</button></p>"
            "<h2>History</h2><ol class='timeline' id='history'></ol><h2>Spec</h2><pre id='spec'></pre>"
            "<h2>Logs</h2><p><select id='rank'></select> <label><input type='checkbox' id='follow' checked> follow"
            "</label> <a id='download' href='#'>download</a></p><pre id='log'></pre>")
    return layout(f"Job {job_id}", body, user, JOB_JS % {"job": json.dumps(job_id)}, poll_s)


def nodes_page(user: str, poll_s: float) -> str:
    body = ("<p>Per GPU over the last hour: utilisation (left), memory used (right). A down node's last "
            "figures are greyed and dated.</p><table><thead><tr><th>node</th><th>state</th><th>drained because"
            "</th><th>jobs</th><th>now</th><th>GPUs (last hour)</th></tr></thead><tbody id='nodes'></tbody></table>")
    return layout("Nodes", body, user, NODES_JS, poll_s)


def cluster_page(user: str, poll_s: float) -> str:
    body = ("<p id='summary'></p><div id='charts'></div><h2>Nodes held per user</h2><table id='by-user'></table>"
            "<h2>Nodes held per priority</h2><table id='by-prio'></table><h2>Quotas and use now</h2>"
            "<table><thead><tr><th>user</th><th>priority</th><th>group</th><th>quota</th><th>used</th></tr></thead>"
            "<tbody id='quotas'></tbody></table>")
    return layout("Cluster", body, user, CLUSTER_JS, poll_s)


def usage_page(user: str, poll_s: float) -> str:
    body = ("<p>GPU-hours per UTC day, user, group and priority over the last <select id='days'>"
            "<option>1</option><option selected>7</option><option>30</option><option>90</option></select> day(s). "
            "<a id='csv' href='/usage.csv'>CSV</a></p><p>per user: <span id='by-user'></span></p>"
            "<p>per group: <span id='by-group'></span></p><p>per priority: <span id='by-priority'></span></p>"
            "<table><thead><tr><th>day</th><th>user</th><th>group</th><th>priority</th><th>GPU-hours</th>"
            "<th>runs</th></tr></thead><tbody id='rows'></tbody></table>")
    return layout("Usage", body, user, USAGE_JS, poll_s)
